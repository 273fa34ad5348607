"""Planning a model of several embedding modules: one search over every module's tables on the same
ranks, a plan that records each table's module, and a replan that keeps them where they were."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from rec.analysis import check_plan
from rec.plan import read_plan, write_plan
from rec.plan.io import SHARD_COLUMNS, dumps_plan
from rec.planning import plan_spec, replan_spec
from rec.search import build_search_space, search_result
from rec.search.bound import lower_bound
from rec.spec import spec_from_rows
from rec.spec.columns import table_to_row
from rec.spec.types import DEFAULT_MODULE
from rec.topology import topology_from_dict
from tests.rec.search_instances import milp_optimum

CUDA_2X2 = topology_from_dict({"world_size": 4, "local_world_size": 2, "compute_device": "cuda",
                               "hbm_cap": "16GiB", "ddr_cap": "64GiB", "batch_size": 512})


def model_rows(seed: int, per_module: int = 6) -> list[dict]:
    """Two bag towers and a sequence tower; one table name shared by all three."""
    rng = np.random.default_rng(seed)
    rows = []
    for module, pooling in (("towers.user.ebc", "SUM"), ("towers.item.ebc", "MEAN"), ("sequence.ec", "NONE")):
        dim = int(rng.choice([32, 64, 128]))
        for i in range(per_module):
            rows.append({"name": "id" if i == 0 else f"{module.split('.')[-2]}_{i}", "module": module,
                         "num_embeddings": int(10 ** rng.uniform(3, 6.5)), "pooling": pooling,
                         "embedding_dim": dim if pooling == "NONE" else int(rng.choice([16, 64, 256])),
                         "pooling_factor": float(np.round(rng.uniform(1, 40), 1))})
    return rows


def test_a_mixed_model_plans_every_module_on_the_same_ranks_and_the_plan_records_modules(tmp_path):
    spec = spec_from_rows(model_rows(0))
    plan = plan_spec(spec, CUDA_2X2)
    assert [(t.module, t.name) for t in plan.tables] == [(t.module, t.name) for t in spec.tables]
    ranks_of = {m: {r for t in plan.tables if t.module == m for r in t.ranks} for m in spec.modules}
    assert len(set().union(*ranks_of.values())) == 4  # one critical path over all modules' shards
    assert max(plan.metrics.rank_perf) == plan.metrics.critical_path

    write_plan(plan, tmp_path)
    text = (tmp_path / "plan.json").read_text()
    assert json.loads(text)["format"] == "shardflow.plan/v3"
    entries = json.loads(text)["tables"]
    assert [e["module"] for e in entries] == [t.module for t in spec.tables]
    shards = pq.read_table(tmp_path / "shards.parquet")
    assert shards.column_names == [*SHARD_COLUMNS[:2], "module", *SHARD_COLUMNS[2:]]
    assert set(zip(shards["module"].to_pylist(), shards["table"].to_pylist(), strict=True)) == \
        {(t.module, t.name) for t in spec.tables}

    again = read_plan(tmp_path)
    check_plan(again)  # validation, the plan_id and every estimate recomputed: tables told apart by module
    assert dumps_plan(again) == text
    assert again.table("sequence.ec.id").module == "sequence.ec"


def test_a_plan_without_modules_is_written_as_before():
    rows = [{"name": "a", "num_embeddings": 1000, "embedding_dim": 16}, {"name": "b", "num_embeddings": 10,
                                                                          "embedding_dim": 8}]
    plain = plan_spec(spec_from_rows(rows), CUDA_2X2)
    explicit = plan_spec(spec_from_rows([{**r, "module": DEFAULT_MODULE} for r in rows]), CUDA_2X2)
    text = dumps_plan(plain)
    assert dumps_plan(explicit) == text and '"module"' not in text
    assert json.loads(text)["format"] == "shardflow.plan/v2"


def test_a_plan_json_that_moves_a_table_to_another_module_is_refused(tmp_path):
    from rec.errors import InputError

    plan = plan_spec(spec_from_rows(model_rows(1)), CUDA_2X2)
    write_plan(plan, tmp_path)
    path = tmp_path / "plan.json"
    path.write_text(path.read_text().replace('"module":"towers.item.ebc"', '"module":"towers.user.ebc"', 1))
    (tmp_path / "shards.parquet").unlink()  # plan.json on its own: a complete plan, checked all the same
    with pytest.raises(InputError) as e:
        check_plan(read_plan(path))
    assert any("towers.item.ebc.id" in str(p) or "towers.user.ebc.id" in str(p) for p in e.value.problems)


@pytest.mark.parametrize("seed", range(6))
def test_bound_and_search_on_small_mixed_models_against_the_milp_optimum(seed):
    rows = model_rows(seed, per_module=2)
    cuda = seed % 2 == 0
    total = sum(r["num_embeddings"] * r["embedding_dim"] * 4 for r in rows)
    topology = topology_from_dict({"world_size": 4, "local_world_size": 2, "batch_size": 512,
                                   "compute_device": "cuda" if cuda else "cpu",
                                   "hbm_cap": int(total / 3) + 64 * 2**20 if cuda else 0, "ddr_cap": "64GiB"})
    space = build_search_space(spec_from_rows(rows), topology)
    optimum = milp_optimum(space)
    result = search_result(space)
    assert lower_bound(space).value <= optimum * (1 + 1e-9)
    assert optimum * (1 - 1e-9) <= result.critical_path <= 1.01 * optimum


def test_a_replan_keeps_every_modules_unchanged_tables_in_place():
    rows = model_rows(2, per_module=8)
    previous = plan_spec(spec_from_rows(rows), CUDA_2X2)
    grown = [dict(r) for r in rows]
    grown[3]["num_embeddings"] *= 2  # a user-tower table grows
    grown.append({**rows[-1], "name": "added", "feature_names": ["added"]})  # the sequence tower gains one
    replanned = replan_spec(spec_from_rows(grown), CUDA_2X2, previous)
    before = {t.key: t for t in previous.tables}
    sequence = [t for t in replanned.plan.tables if t.module == "sequence.ec" and t.name != "added"]
    assert sequence and all(t.shards == before[t.key].shards for t in sequence)
    assert replanned.movement.kept_tables == len(rows) - 1 and replanned.movement.added_tables == 1
    assert replanned.movement.moved_bytes <= movement_of_fresh(previous, replanned)
    check_plan(replanned.plan)
    assert table_to_row(spec_from_rows(grown).tables[-1])["module"] == "sequence.ec"


def movement_of_fresh(previous, replanned) -> int:
    from rec.plan.movement import movement

    return movement(previous, replanned.fresh).moved_bytes


def test_a_plan_giving_an_embedding_collection_a_sharding_its_sharder_lacks_is_refused(tmp_path):
    from rec.errors import InputError

    rows = [{"name": "s", "num_embeddings": 100_000, "embedding_dim": 64, "pooling": "NONE", "module": "seq",
             "sharding_types": ["row_wise"]}, {"name": "b", "num_embeddings": 100, "embedding_dim": 8}]
    write_plan(plan_spec(spec_from_rows(rows), CUDA_2X2), tmp_path)
    path = tmp_path / "plan.json"
    path.write_text(path.read_text().replace('"sharding_type":"row_wise"', '"sharding_type":"table_row_wise"', 1))
    (tmp_path / "shards.parquet").unlink()
    with pytest.raises(InputError) as e:
        check_plan(read_plan(path))
    assert "table seq.s: table_row_wise/fused is not available on cuda for TorchRec's EmbeddingCollectionSharder" \
        in [str(p) for p in e.value.problems]
