"""Plans: built from a search, validated, written byte-stable, read back unchanged."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rec.errors import InputError
from rec.plan import PLAN_FORMAT, read_plan, validate_plan, write_plan
from rec.plan.types import Shard
from rec.planning import plan_spec
from rec.sharding import ShardingType
from rec.spec.synthetic import criteo_1tb_spec, issue2282_spec, mixed_spec
from rec.topology import topology_from_dict

H100_2X8 = dict(world_size=16, local_world_size=8, compute_device="cuda", hbm_cap="80GiB",
                ddr_cap="128GiB")


@pytest.fixture(scope="module")
def plan():
    return plan_spec(mixed_spec(), topology_from_dict(dict(H100_2X8)))


def test_every_table_is_planned_once_and_the_plan_validates(plan):
    assert len(plan.tables) == len(mixed_spec())
    assert len({t.name for t in plan.tables}) == len(plan.tables)
    kinds = {t.sharding_type for t in plan.tables}
    assert {ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL} <= kinds
    assert not validate_plan(plan)
    assert plan.metrics.critical_path >= plan.metrics.lower_bound
    assert plan.metrics.critical_path == pytest.approx(max(plan.metrics.rank_perf))


def test_identical_inputs_give_identical_plan_files(tmp_path):
    spec, topo = issue2282_spec(80, seed=2), topology_from_dict(dict(H100_2X8))
    a = write_plan(plan_spec(spec, topo), tmp_path / "a")
    b = write_plan(plan_spec(spec, topo), tmp_path / "b")
    assert json.loads(a.read_text())["format"] == PLAN_FORMAT
    assert a.read_bytes() == b.read_bytes()
    assert (tmp_path / "a/shards.parquet").read_bytes() == (tmp_path / "b/shards.parquet").read_bytes()


def test_plan_id_changes_with_spec_topology_and_planner_config():
    from rec.config.cost import CostConfig, Optimizer

    topo = topology_from_dict(dict(H100_2X8))
    base = plan_spec(issue2282_spec(20), topo).plan_id
    assert plan_spec(issue2282_spec(21), topo).plan_id != base
    assert plan_spec(issue2282_spec(20), topology_from_dict({**H100_2X8, "batch_size": 1024})).plan_id != base
    assert plan_spec(issue2282_spec(20), topo, CostConfig(optimizer=Optimizer.ADAM)).plan_id != base
    assert plan_spec(issue2282_spec(20), topo).plan_id == base


def test_written_plan_reads_back_equal(tmp_path, plan):
    write_plan(plan, tmp_path)
    assert read_plan(tmp_path / "plan.json") == plan
    assert read_plan(tmp_path) == plan


def test_shards_parquet_has_one_row_per_shard(tmp_path, plan):
    import pyarrow.parquet as pq

    write_plan(plan, tmp_path)
    rows = pq.ParquetFile(tmp_path / "shards.parquet").read().to_pylist()
    assert len(rows) == sum(len(t.shards) for t in plan.tables)
    first = plan.tables[0]
    mine = [r for r in rows if r["table"] == first.name]
    assert [r["rank"] for r in mine] == [s.rank for s in first.shards]
    assert {r["plan_id"] for r in rows} == {plan.plan_id}


def _with_table(plan, index, **changes):
    tables = list(plan.tables)
    tables[index] = replace(tables[index], **changes)
    return replace(plan, tables=tuple(tables))


def test_validation_names_missing_and_duplicated_tables(plan):
    broken = replace(plan, tables=plan.tables[1:] + plan.tables[-1:])
    text = "\n".join(map(str, validate_plan(broken).items))
    assert f"table {plan.tables[0].name}: is missing" in text
    assert f"table {plan.tables[-1].name}: planned more than once" in text


def test_validation_catches_shards_that_do_not_tile_the_table(plan):
    t = next(t for t in plan.tables if t.sharding_type is ShardingType.TABLE_WISE)
    i = plan.tables.index(t)
    rows, cols = t.shards[0].sizes
    bad = (Shard(t.shards[0].rank, (0, 0), (rows - 1, cols)),)
    problems = validate_plan(_with_table(plan, i, shards=bad))
    assert any("do not tile" in p.reason for p in problems.items)


def test_validation_catches_out_of_range_ranks_and_allow_list_violations(plan):
    t0 = plan.tables[0]
    far = tuple(replace(s, rank=99) for s in t0.shards)
    assert any("out of range" in p.reason for p in validate_plan(_with_table(plan, 0, shards=far)).items)
    tables = list(plan.spec.tables)
    tables[0] = replace(tables[0], sharding_types=(ShardingType.ROW_WISE,))
    restricted = replace(plan, spec=replace(plan.spec, tables=tuple(tables)))
    if t0.sharding_type is not ShardingType.ROW_WISE:
        assert any("allow-list" in p.reason for p in validate_plan(restricted).items)


def test_validation_catches_memory_over_capacity(plan):
    m = plan.metrics
    over = replace(m, rank_hbm=(m.rank_hbm_cap[0] + 1, *m.rank_hbm[1:]))
    assert any("exceeds its capacity" in p.reason for p in validate_plan(replace(plan, metrics=over)).items)


def test_reading_a_file_that_is_not_a_plan_is_a_user_error(tmp_path):
    (tmp_path / "plan.json").write_text('{"format": "something else"}')
    with pytest.raises(InputError, match="not a shardflow plan"):
        read_plan(tmp_path / "plan.json")
    with pytest.raises(InputError, match="no such file"):
        read_plan(tmp_path / "missing.json")


def test_huge_tables_on_two_hosts_can_go_row_wise_across_all_ranks_when_allowed():
    # TorchRec issue 2510: a 1.6B-row table on 2 hosts x 8 GPUs. With row_wise allowed only,
    # every rank holds 100M rows.
    spec_rows = [dict(name="huge", num_embeddings=1_600_000_000, embedding_dim=64,
                      sharding_types=["row_wise"])]
    from rec.spec import spec_from_rows

    plan = plan_spec(spec_from_rows(spec_rows), topology_from_dict(dict(H100_2X8)))
    t = plan.tables[0]
    assert t.sharding_type is ShardingType.ROW_WISE
    assert [s.sizes[0] for s in t.shards] == [100_000_000] * 16
    assert [s.rank for s in t.shards] == list(range(16))


def test_criteo_plan_fits_and_is_close_to_the_bound():
    plan = plan_spec(criteo_1tb_spec(), topology_from_dict(dict(H100_2X8)))
    m = plan.metrics
    assert all(h <= c for h, c in zip(m.rank_hbm, m.rank_hbm_cap, strict=True))
    assert m.gap < 0.05


def test_tables_that_fit_one_by_one_but_not_together_on_cpu_name_what_cpu_ranks_have():
    from rec.spec import spec_from_rows

    spec = spec_from_rows([{"name": n, "num_embeddings": 3_000_000, "embedding_dim": 512} for n in "abc"])
    topology = topology_from_dict({"world_size": 2, "compute_device": "cpu", "ddr_cap": "8GiB"})
    with pytest.raises(InputError) as e:
        plan_spec(spec, topology)
    text = e.value.render()
    assert "fit one by one but not all together" in text and "usable memory (ddr_cap) 16.0 GiB" in text
    assert "fused_uvm_caching" not in text and "storage_reservation" not in text  # neither applies on cpu


def test_tables_that_fit_one_by_one_but_not_together_on_cuda_name_the_cache_kernel_only_where_a_list_leaves_it_out():
    """The advice to allow fused_uvm_caching once came where every kernel was allowed already."""
    from rec.spec import spec_from_rows

    rows = [{"name": f"t{i}", "num_embeddings": 20_000_000, "embedding_dim": 128} for i in range(6)]
    topology = topology_from_dict({"world_size": 2, "compute_device": "cuda", "hbm_cap": "16GiB", "ddr_cap": "16GiB"})
    with pytest.raises(InputError, match="fit one by one but not all together") as e:
        plan_spec(spec_from_rows(rows), topology)
    assert "fused_uvm_caching" not in e.value.render() and "add ranks or memory" in e.value.render()
    listed = [{**row, "compute_kernels": ["fused", "fused_uvm"]} for row in rows]
    with pytest.raises(InputError, match="fit one by one but not all together") as e:
        plan_spec(spec_from_rows(listed), topology)
    assert "allow fused_uvm_caching for t" in e.value.render()
