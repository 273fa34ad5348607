"""Specs of several embedding modules: the ``module`` column and pooling NONE (EmbeddingCollection),
read from every format, validated with every problem at once, hashed as before when absent."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rec.errors import InputError
from rec.sharding import ModuleKind, Pooling
from rec.spec import read_spec, spec_from_rows, write_spec
from rec.spec.columnar import columnar_spec
from rec.spec.columns import table_to_row
from rec.spec.hashing import rows_hash
from rec.spec.types import DEFAULT_MODULE

MODEL = [
    {"name": "user_id", "num_embeddings": 1000, "embedding_dim": 64, "module": "towers.user.ebc"},
    {"name": "geo", "num_embeddings": 200, "embedding_dim": 16, "pooling": "MEAN", "module": "towers.user.ebc"},
    {"name": "item_id", "num_embeddings": 5000, "embedding_dim": 64, "module": "towers.item.ebc",
     "feature_names": ["item", "item_seen"]},
    {"name": "history", "num_embeddings": 5000, "embedding_dim": 32, "pooling": "NONE", "pooling_factor": 40,
     "module": "sequence.blocks.0.ec", "sharding_types": ["row_wise", "table_wise"]},
    # Same table and feature names as in other modules: TorchRec addresses tables by module path.
    {"name": "user_id", "num_embeddings": 1000, "embedding_dim": 32, "pooling": "NONE",
     "module": "sequence.blocks.0.ec", "feature_names": ["item"]},
    {"name": "country", "num_embeddings": 300, "embedding_dim": 8},  # shardflow's own model's EBC
]


def problems_of(rows: list[dict]) -> list[str]:
    with pytest.raises(InputError) as e:
        spec_from_rows(rows)
    return [str(p) for p in e.value.problems]


def test_a_spec_names_its_modules_and_their_kinds_in_model_order():
    spec = spec_from_rows(MODEL)
    assert spec.modules == {
        "towers.user.ebc": ModuleKind.EMBEDDING_BAG_COLLECTION,
        "towers.item.ebc": ModuleKind.EMBEDDING_BAG_COLLECTION,
        "sequence.blocks.0.ec": ModuleKind.EMBEDDING_COLLECTION,
        DEFAULT_MODULE: ModuleKind.EMBEDDING_BAG_COLLECTION,
    }
    assert spec.keys == ["towers.user.ebc.user_id", "towers.user.ebc.geo", "towers.item.ebc.item_id",
                         "sequence.blocks.0.ec.history", "sequence.blocks.0.ec.user_id", "country"]
    assert spec.tables[3].pooling is Pooling.NONE and not spec.tables[3].pooled
    assert spec.tables[5].module == DEFAULT_MODULE and "module" not in table_to_row(spec.tables[5])


def test_a_spec_without_modules_means_and_hashes_what_it_did():
    rows = [{"name": "a", "num_embeddings": 10, "embedding_dim": 4}, {"name": "b", "num_embeddings": 20,
                                                                       "embedding_dim": 8, "pooling": "MEAN"}]
    plain = spec_from_rows(rows)
    explicit = spec_from_rows([{**r, "module": DEFAULT_MODULE} for r in rows])
    assert explicit == plain and explicit.spec_hash == plain.spec_hash
    # The hash shardflow recorded for this spec before modules existed (format shardflow.spec/v1).
    assert plain.spec_hash == rows_hash([table_to_row(t) for t in plain.tables])
    moved = spec_from_rows([{**r, "module": "towers.0"} for r in rows])
    assert moved.spec_hash != plain.spec_hash  # the module is part of what a table is
    assert moved.spec_hash == rows_hash([table_to_row(t) for t in moved.tables])


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".csv", ".yaml", ".json"])
def test_modules_and_unpooled_tables_survive_every_format(tmp_path, suffix):
    spec = spec_from_rows(MODEL)
    again = read_spec(write_spec(spec, tmp_path / f"model{suffix}"))
    assert again == spec and again.spec_hash == spec.spec_hash


def test_a_spec_without_modules_is_written_without_a_module_column(tmp_path):
    spec = spec_from_rows(MODEL[-1:])
    assert "module" not in pq.read_schema(write_spec(spec, tmp_path / "s.parquet")).names
    assert "module" not in (write_spec(spec, tmp_path / "s.csv")).read_text().splitlines()[0]


def test_typed_files_take_the_fast_path_and_agree_with_the_row_validator():
    spec = spec_from_rows(MODEL)
    table = pa.Table.from_pylist([table_to_row(t) | {"module": t.module} for t in spec.tables])
    fast = columnar_spec(table)
    assert fast is not None and fast == spec and fast.spec_hash == spec.spec_hash


def test_every_module_problem_is_reported_at_once_from_any_format(tmp_path):
    rows = [
        {"name": "a", "num_embeddings": 10, "embedding_dim": 8, "module": "towers..user"},
        {"name": "b", "num_embeddings": 10, "embedding_dim": 8, "module": "u.ebc", "feature_names": ["f"]},
        {"name": "b", "num_embeddings": 10, "embedding_dim": 8, "module": "u.ebc", "feature_names": ["g"]},
        {"name": "c", "num_embeddings": 10, "embedding_dim": 8, "module": "u.ebc", "feature_names": ["f"]},
        {"name": "d", "num_embeddings": 10, "embedding_dim": 8, "module": "u.ebc", "pooling": "NONE"},
        {"name": "e", "num_embeddings": 10, "embedding_dim": 8, "module": "s.ec", "pooling": "NONE",
         "sharding_types": ["table_row_wise", "row_wise"]},
        {"name": "f", "num_embeddings": 10, "embedding_dim": 16, "module": "s.ec", "pooling": "NONE"},
        {"name": "g", "num_embeddings": 10, "embedding_dim": 16, "module": "s.ec.inner"},
    ]
    expected = [
        "table 'a': module: 'towers..user' is not a module path",
        "table 'b' in module 'u.ebc': duplicate name (rows 2 and 3)",
        "table 'c' in module 'u.ebc': feature 'f' is also used by table 'b'",
        "module 's.ec.inner': lies inside module 's.ec'",
        "module 'u.ebc': mixes pooling NONE (an EmbeddingCollection: d) with SUM/MEAN (an EmbeddingBagCollection: "
        "b, c)",
        "module 's.ec': an EmbeddingCollection's tables must share one embedding_dim",
        "table 'e' in module 's.ec': sharding_types: table_row_wise is not offered by TorchRec's "
        "EmbeddingCollectionSharder",
    ]
    for found in (problems_of(rows), _parquet_problems(rows, tmp_path)):
        assert len(found) == len(expected)
        for line, start in zip(sorted(found), sorted(expected), strict=True):
            assert line.startswith(start), (line, start)


def _parquet_problems(rows: list[dict], tmp_path) -> list[str]:
    path = tmp_path / "bad.parquet"
    columns = list(dict.fromkeys(k for row in rows for k in row))  # from_pylist would take the first row's
    pq.write_table(pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows]), path)
    with pytest.raises(InputError) as e:
        read_spec(path)
    return [str(p) for p in e.value.problems]


def test_a_module_path_is_a_dotted_name_of_attributes_list_indices_and_module_dict_keys():
    # ModuleDict keys as TorchRec plans them: "user-tower", "2tower" (spec from-model refused them)
    ok = ["ebc", "model.sparse_arch.embedding_bag_collection", "towers.0.ebc", "0", "_private.x1",
          "towers.user-tower.ebc", "2tower.ebc"]
    for path in ok:
        table = spec_from_rows([{"name": "a", "num_embeddings": 1, "embedding_dim": 4, "module": path}]).tables[0]
        assert table.module == path
    assert spec_from_rows([{"name": "a", "num_embeddings": 1, "embedding_dim": 4, "module": 3}]).tables[0].module == "3"
    for path in [".ebc", "ebc.", "a..b", "a.-b", "-a", "a b", "a/b", "a:b", "x" * 513]:
        assert any("is not a module path" in p for p in problems_of(
            [{"name": "a", "num_embeddings": 1, "embedding_dim": 4, "module": path}])), path


def test_unpooled_outputs_count_toward_the_output_width_bound_per_id():
    wide = {"name": "s", "num_embeddings": 10, "embedding_dim": 65536, "module": "ec", "pooling": "NONE"}
    spec_from_rows([wide])  # one id per sample: 65,536 values wide
    assert any("values wide" in p for p in problems_of([{**wide, "pooling_factor": 2100}]))
    spec_from_rows([{**wide, "pooling": "SUM", "pooling_factor": 2100}])  # pooled: still one vector


WEIGHTED = [
    {"name": "clicks", "num_embeddings": 1000, "embedding_dim": 16, "module": "sparse.weighted_ebc",
     "is_weighted": True},
    {"name": "scores", "num_embeddings": 500, "embedding_dim": 16, "module": "sparse.weighted_ebc",
     "is_weighted": True, "pooling": "MEAN"},
    {"name": "user_id", "num_embeddings": 1000, "embedding_dim": 16, "module": "sparse.ebc"},
]


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".csv", ".yaml", ".json"])
def test_weighted_tables_survive_every_format_and_hash_as_their_rows(tmp_path, suffix):
    spec = spec_from_rows(WEIGHTED)
    assert [t.is_weighted for t in spec.tables] == [True, True, False]
    again = read_spec(write_spec(spec, tmp_path / f"weighted{suffix}"))
    assert again == spec and again.spec_hash == spec.spec_hash
    assert spec.spec_hash == rows_hash([table_to_row(t) for t in spec.tables])
    unweighted = spec_from_rows([{k: v for k, v in r.items() if k != "is_weighted"} for r in WEIGHTED])
    assert unweighted.spec_hash != spec.spec_hash  # the weights are part of what a table is
    # is_weighted false, given or not, is the same table (a spec without the column hashes as before)
    assert spec_from_rows([{**r, "is_weighted": False} for r in WEIGHTED[2:]]).spec_hash == \
        spec_from_rows(WEIGHTED[2:]).spec_hash
    assert "is_weighted" not in pq.read_schema(write_spec(unweighted, tmp_path / "u.parquet")).names


def test_a_module_is_weighted_as_a_whole_and_only_a_bag_collection(tmp_path):
    rows = [
        {**WEIGHTED[0]},
        {**WEIGHTED[2], "module": "sparse.weighted_ebc"},
        {"name": "seq", "num_embeddings": 10, "embedding_dim": 8, "module": "s.ec", "pooling": "NONE",
         "is_weighted": True},
        {"name": "odd", "num_embeddings": 10, "embedding_dim": 8, "is_weighted": "maybe"},
    ]
    expected = [
        "module 'sparse.weighted_ebc': mixes weighted tables (clicks) with unweighted ones (user_id)",
        "module 's.ec': has weighted tables (seq) and pooling NONE",
        "table 'odd': is_weighted: expected true or false, got 'maybe'",
    ]
    as_text = [{**r, "is_weighted": str(r["is_weighted"]).lower()} if "is_weighted" in r else r for r in rows]
    for found in (problems_of(rows), _parquet_problems(as_text, tmp_path)):  # CSV-like text cells too
        assert len(found) == len(expected), found
        for line, start in zip(sorted(found), sorted(expected), strict=True):
            assert line.startswith(start), (line, start)


def test_the_weighted_example_names_its_weighted_module_and_plans():
    from rec.planning import plan_spec
    from rec.topology import read_topology
    from tests.paths import CPU_2PROC, SPECS

    spec = read_spec(SPECS / "sparse_nn.yaml")
    assert {t.module for t in spec.tables if t.is_weighted} == {"sparse.weighted_ebc"}
    plan = plan_spec(spec, read_topology(CPU_2PROC))
    assert {t.key for t in plan.tables} == set(spec.keys)


def test_typed_weighted_files_take_the_fast_path_and_a_mixed_module_goes_to_the_row_validator():
    spec = spec_from_rows(WEIGHTED)
    rows = [table_to_row(t) | {"module": t.module, "is_weighted": t.is_weighted or None} for t in spec.tables]
    fast = columnar_spec(pa.Table.from_pylist(rows))  # a boolean column, null where unweighted
    assert fast is not None and fast == spec and fast.spec_hash == spec.spec_hash
    mixed = [{**rows[0], "is_weighted": False}, *rows[1:]]
    assert columnar_spec(pa.Table.from_pylist(mixed)) is None  # the row validator names the module
    with pytest.raises(InputError, match="mixes weighted tables"):
        spec_from_rows(mixed)
