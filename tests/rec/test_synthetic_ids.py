"""Synthetic ids as training would draw them: each table's from its hit-rate curve (else the skew
model), hot rows scattered over the table; the numpy draw (``rec.data.synthetic``, the training
job's) and the torch one (``rec.train.synthetic_ids``, the measuring job's) alike; and the measuring
job's pool sized so that every cached table's ids outgrow its cache (``rec.train.synthetic_pool``)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from rec.cost.unique import expected_touched
from rec.data.order import Position
from rec.data.synthetic import SyntheticSource, synthetic_columns
from rec.data.synthetic import table_ids as numpy_ids
from rec.hit_rates import INT64_SPREAD_ROWS, row_of, spread
from rec.plan.load_factors import load_factors
from rec.plan.types import Plan
from rec.planning import plan_spec
from rec.sharding import ComputeDevice, ComputeKernel
from rec.spec import spec_from_rows
from rec.spec.columns import table_to_row
from rec.spec.types import Spec
from rec.topology import topology_from_dict
from rec.train.measure_config import AUTO_POOL, MeasureConfig
from rec.train.measure_job import block_sizes, synthetic_features
from rec.train.measure_report import measure_report
from rec.train.synthetic_ids import table_ids as torch_ids
from rec.train.synthetic_pool import (
    MAX_POOL,
    MIN_POOL,
    TOUCH_FACTOR,
    CachedTable,
    Pool,
    batch_bytes,
    cached_tables,
    pool_size,
    synthetic_pool,
)
from rec.train.timings import _plan_times

CURVE = ((0.01, 0.3), (0.1, 0.6), (0.5, 0.95))
ROWS = 20_000
BATCH = 500
POOLING = 6.0


def two_tables() -> Spec:
    """A table with a measured curve and one without (the skew model), one feature each."""
    return spec_from_rows([
        {"name": "curved", "num_embeddings": ROWS, "embedding_dim": 8, "feature_names": ["c"],
         "pooling_factor": POOLING, "hit_rate_curve": [list(p) for p in CURVE]},
        {"name": "skewed", "num_embeddings": ROWS, "embedding_dim": 8, "feature_names": ["s"],
         "pooling_factor": POOLING},
    ])


def drawn_numpy(batches: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Each feature's ids over ``batches`` batches of the training job's synthetic source."""
    source = SyntheticSource(two_tables(), dense_in_features=1, seed=seed, distinct=batches)
    made = source.batches(Position(1), 0, BATCH)
    columns = [next(made) for _ in range(batches)]
    return {f: np.concatenate([c.ids[k] for c in columns]) for k, f in enumerate(("c", "s"))}


def drawn_torch(batches: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Each feature's ids over ``batches`` batches of the measuring job's pool (on cpu here)."""
    made = synthetic_features(two_tables(), BATCH, seed, batches, torch.device("cpu"))
    pool = [next(made) for _ in range(batches)]
    kjts = [batch[path] for batch in pool for path in batch]
    return {f: torch.cat([kjt[f].values() for kjt in kjts]).numpy() for f in ("c", "s")}


@pytest.mark.parametrize("drawn", [drawn_numpy, drawn_torch])
def test_distinct_rows_touched_per_table_are_the_expected(drawn):
    ids = drawn(8)
    for feature, curve in (("c", CURVE), ("s", None)):
        values = ids[feature]
        assert values.min() >= 0 and values.max() < ROWS
        touched = len(np.unique(values))
        assert touched == pytest.approx(expected_touched(len(values), ROWS, curve), rel=0.03), feature


def test_the_hottest_rows_serve_the_curves_share_of_the_lookups():
    values = drawn_numpy(8)["c"]
    hottest = np.empty(ROWS, dtype=np.int64)
    hottest[spread(np.arange(ROWS), ROWS)] = np.arange(ROWS)  # undo the scattering: row -> its rank
    ranks = hottest[values]
    for fraction, share in CURVE:
        assert np.mean(ranks < fraction * ROWS) == pytest.approx(share, abs=0.01)


def test_lengths_stay_poisson_with_the_pooling_factor():
    made = synthetic_features(two_tables(), BATCH, 0, 4, torch.device("cpu"))
    lengths = torch.cat([next(made)[path].lengths() for path in two_tables().modules for _ in range(4)])
    assert lengths.double().mean().item() == pytest.approx(POOLING, rel=0.05)
    columns = synthetic_columns(two_tables(), BATCH, 1, np.random.default_rng(0))
    assert np.concatenate(columns.lengths).mean() == pytest.approx(POOLING, rel=0.05)


@pytest.mark.parametrize("rows", [1, 2, 997, 1_000_003 * 6, 10**9, INT64_SPREAD_ROWS + 7, 2**45 + 3])
@pytest.mark.parametrize("curve", [None, CURVE])
def test_the_torch_and_numpy_draws_agree_for_the_same_uniforms(rows, curve):
    u = np.random.default_rng(rows).random(200_000 if rows < INT64_SPREAD_ROWS else 500)
    expected = numpy_ids(u, rows, curve)
    assert np.array_equal(torch_ids(torch.from_numpy(u), rows, curve).numpy(), expected)
    assert np.array_equal(spread(row_of(u, rows, curve), rows), expected)


@pytest.mark.parametrize("rows", [1000, 123_457, 1 << 20, 10**6, 2 * 10**6, 10**8])
def test_spread_puts_hot_rows_on_every_row_wise_shard(rows):
    shards = 8
    hot = spread(np.arange(rows // 100), rows)  # the hottest 1%
    per_shard = np.bincount(hot * shards // rows, minlength=shards)
    assert per_shard.min() >= 0.75 * len(hot) / shards


def test_spread_is_a_bijection():
    for rows in (1, 7, 1000, 123_457):
        assert np.array_equal(np.sort(spread(np.arange(rows), rows)), np.arange(rows))
    for rows in (2**40, 6 * 10**9 + 1):  # beyond int64 products: Python integers
        assert len(np.unique(spread(np.arange(100_000), rows))) == 100_000


# ---------------------------------------------------------------- the measuring job's pool


def test_the_auto_pool_is_the_smallest_whose_ids_touch_four_times_each_cache():
    tables = [CachedTable("curved", 10**7, 0.2 * 10**7, 1_000_000, CURVE),
              CachedTable("skewed", 10**7, 0.1 * 10**7, 2_000_000, None)]
    pool = pool_size(tables, batch_bytes=1e6)
    assert MIN_POOL < pool.batches < MAX_POOL and pool.reached
    assert all(t.touched(pool.batches) >= TOUCH_FACTOR * t.cache_rows for t in tables)
    assert any(t.touched(pool.batches - 1) < TOUCH_FACTOR * t.cache_rows for t in tables)
    assert pool.touched_over_cache == pytest.approx(min(t.touched(pool.batches) / t.cache_rows for t in tables))


def test_the_auto_pool_stops_at_ninety_percent_of_a_tables_rows_and_at_its_caps():
    large_cache = CachedTable("t", 100_000, 50_000, 20_000)  # 4x its cache is more than the table
    pool = pool_size([large_cache], batch_bytes=1e6)
    assert large_cache.touched(pool.batches) >= 0.9 * 100_000 * (1 - 1e-9) and pool.reached
    assert pool.touched_over_cache is not None and pool.touched_over_cache < TOUCH_FACTOR
    huge = CachedTable("t", 10**10, 2 * 10**9, 10_000)
    assert pool_size([huge], batch_bytes=1e6) == Pool(MAX_POOL, huge.touched(MAX_POOL) / huge.cache_rows, False)
    assert pool_size([huge], batch_bytes=1e6, budget=20e6).batches == 20  # the memory budget
    assert pool_size([huge], batch_bytes=1e6, budget=3e6) == Pool(3, huge.touched(3) / huge.cache_rows, False)
    assert pool_size([huge], batch_bytes=1e9, budget=1e6).batches == 1  # the budget holds, down to one batch
    assert pool_size([], batch_bytes=1e6) == Pool(MIN_POOL)
    assert pool_size([], batch_bytes=1.5e9) == Pool(1)  # cpu: 4 batches of 1.5 GB would be 6 GB


def cuda_plan() -> Plan:
    spec = spec_from_rows([
        {"name": "cached", "num_embeddings": 400_000, "embedding_dim": 16, "feature_names": ["a"],
         "pooling_factor": 8.0, "compute_kernels": ["fused_uvm_caching"], "hit_rate_curve": [list(p) for p in CURVE]},
        {"name": "in_hbm", "num_embeddings": 1000, "embedding_dim": 16, "feature_names": ["b"],
         "compute_kernels": ["fused"]},
    ])
    topology = topology_from_dict({"world_size": 2, "local_world_size": 2, "compute_device": "cuda",
                                   "hbm_cap": "8GiB", "ddr_cap": "64GiB", "batch_size": 4096})
    return plan_spec(spec, topology)


def test_a_plans_cached_tables_size_its_pool_and_a_cpu_plan_keeps_four_batches():
    plan = cuda_plan()
    assert [t.compute_kernel for t in plan.tables] == [ComputeKernel.FUSED_UVM_CACHING, ComputeKernel.FUSED]
    (table,) = cached_tables(plan)
    factor = float(load_factors(plan)[0])  # what the job builds the cache with
    assert (table.key, table.rows, table.cache_rows, table.lookups, table.curve) == (
        "cached", 400_000, factor * 400_000, 2 * 4096 * 8.0, CURVE)
    pool = synthetic_pool(plan, AUTO_POOL)
    assert pool == pool_size([table], batch_bytes(plan)) and MIN_POOL < pool.batches < MAX_POOL and pool.reached
    assert table.touched(pool.batches) >= min(TOUCH_FACTOR * table.cache_rows, 0.9 * 400_000) * (1 - 1e-9)
    assert pool.fill_iterations == math.ceil(pool.batches / TOUCH_FACTOR)
    assert synthetic_pool(plan, 4).batches == 4  # an explicit count stands
    cpu = replace(plan, topology=replace(plan.topology, compute_device=ComputeDevice.CPU))
    assert synthetic_pool(cpu, AUTO_POOL) == Pool(MIN_POOL)  # no cache on cpu


def test_a_cache_holds_the_plans_load_factor_else_the_specs_else_the_cost_models():
    plan = cuda_plan()
    chosen = replace(plan, tables=tuple(replace(t, cache_load_factor=0.05 if t.key == "cached" else None)
                                        for t in plan.tables))
    assert cached_tables(chosen)[0].cache_rows == pytest.approx(0.05 * 400_000)
    unchosen = replace(plan, tables=tuple(replace(t, cache_load_factor=None) for t in plan.tables))
    assert cached_tables(unchosen)[0].cache_rows == pytest.approx(plan.planner.cost.caching_ratio * 400_000)
    given = replace(unchosen, spec=spec_from_rows([
        {**table_to_row(t), "cache_load_factor": 0.3} if t.key == "cached" else table_to_row(t)
        for t in plan.spec.tables]))
    assert cached_tables(given)[0].cache_rows == pytest.approx(0.3 * 400_000)


def test_blocks_cover_whole_passes_of_a_small_pool_and_walk_a_large_auto_one():
    explicit = MeasureConfig(iterations=24, blocks=3, synthetic_batches=4)
    assert block_sizes(explicit) == [8, 8, 8]
    assert block_sizes(MeasureConfig(iterations=24, blocks=3, synthetic_batches=16)) == [32]  # as before
    auto = MeasureConfig(iterations=24, blocks=3)
    assert block_sizes(auto) == [8, 8, 8]  # a pool of MIN_POOL (cpu): as an explicit 4
    few = MeasureConfig(iterations=4, blocks=3)
    assert block_sizes(few) == block_sizes(replace(few, synthetic_batches=4)) == [4]
    assert block_sizes(auto, 5) == [10, 10, 10]
    assert block_sizes(auto, 100) == [8, 8, 8]  # a pool sized for the caches is walked


def test_the_report_carries_the_pool_and_old_timings_read_without_it():
    plan = cuda_plan()
    p = {"plan_path": "p", "plan_id": plan.plan_id, "status": "measured", "warmup": 1,
         "fwd_ms": [[1.0, 1.0]] * 2, "bwd_ms": [[2.0, 2.0]] * 2}
    old = _plan_times(p)
    assert (old.synthetic_batches, old.touched_over_cache, old.touch_target_reached) == (0, None, None)
    times = _plan_times({**p, "synthetic_batches": 40, "touched_over_cache": 4.2, "touch_target_reached": True})
    assert times == replace(old, synthetic_batches=40, touched_over_cache=4.2, touch_target_reached=True)
    from rec.profile.types import Machine

    report = measure_report(plan, times, Machine(ComputeDevice.CUDA))
    assert (report.synthetic_batches, report.touched_over_cache, report.touch_target_reached) == (40, 4.2, True)
    assert measure_report(plan, old, Machine(ComputeDevice.CUDA)).synthetic_batches is None
