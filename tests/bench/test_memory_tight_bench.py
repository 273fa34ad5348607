"""``bench/memory_tight_bench.py``'s workloads: memory-tight for real, valid, from every generator, on
seeds reserved apart from the ones the model and the out-of-family set were chosen on."""

from __future__ import annotations

import dataclasses
import math

import pytest


@pytest.fixture(scope="module")
def bench():
    from bench import memory_tight_bench

    return memory_tight_bench


def test_every_workload_holds_its_tables_several_times_over_the_hbm_and_within_the_ddr(bench):
    from bench.gpu_check.families import OOF_SEEDS

    assert not set(bench.SEEDS) & set(OOF_SEEDS)
    for shapes, generators, first, least in (
            ({}, bench.GENERATORS, bench.SEEDS.start, 1.9),
            ({"other": True}, bench.OTHER_GENERATORS, 3200, 1.9),  # --other-shapes
            ({"third": True}, bench.THIRD_GENERATORS, bench.THIRD_SEEDS.start, 1.9),
            ({"fourth": True}, bench.FOURTH_GENERATORS, bench.FOURTH_SEEDS.start, 1.25),
            ({"fifth": True}, bench.FIFTH_GENERATORS, bench.FIFTH_SEEDS.start, 1.04)):
        kinds = set()
        for seed in range(first, first + 12):
            w = bench.workload(seed, **shapes)
            kinds.add(w.name.rsplit("-", 1)[0])
            spec = bench.spec_of(w)  # a valid spec: spec_from_rows names every problem
            weights = sum(t.num_embeddings * t.embedding_dim * t.data_type.bytes_per_element for t in spec.tables)
            hbm = w.world_size * w.hbm_gib * bench.GiB
            assert least * hbm < weights <= 0.5 * w.world_size * bench.DDR_PER_RANK, w.name
        assert kinds == set(generators)


def test_a_fourth_set_workload_gives_no_statistics_for_about_a_third_of_its_tables(bench):
    """``--fourth-shapes``: every planner gets the same constraints, without ``CacheParams`` for the
    tables the user has no statistics for."""
    without = total = 0
    for seed in range(bench.FOURTH_SEEDS.start, bench.FOURTH_SEEDS.start + 8):
        w = bench.workload(seed, fourth=True)
        constraints = bench.constraints_of(w, with_stats=True)
        for t in w.tables:
            assert (constraints[t.name].cache_params is None) == (not t.stats), t.name
        without += sum(not t.stats for t in w.tables)
        total += len(w.tables)
    assert 0.25 < without / total < 0.42


def test_the_fifth_set_plans_on_ranks_that_are_not_a_power_of_two_some_barely_over_the_hbm(bench):
    """``--fifth-shapes``: 3, 6 and 12 ranks among its topologies; a workload barely over the HBM beside
    ones many times over it; a fifth of the tables without statistics."""
    first = bench.FIFTH_SEEDS.start
    workloads = [bench.workload(seed, fifth=True) for seed in range(first, first + 24)]
    assert {3, 6, 12} & {w.world_size for w in workloads}
    assert min(w.times_hbm for w in workloads) < 1.5 < 10 < max(w.times_hbm for w in workloads)
    without = sum(not t.stats for w in workloads for t in w.tables) / sum(len(w.tables) for w in workloads)
    assert 0.12 < without < 0.28
    assert any(t.features > 1 for w in workloads for t in w.tables)


def test_zipf_statistics_are_torchrecs_cache_statistics(bench):
    stats = bench.ZipfStats(rows=10_000_000, alpha=0.9, lookups=1e5)
    misses = [stats.expected_miss_rate(f) for f in (0.0, 0.01, 0.1, 0.5, 1.0)]
    assert misses[0] == 1.0 and misses[-1] == 0.0 and misses == sorted(misses, reverse=True)
    assert 0 < stats.cacheability < 1 and stats.expected_lookups == 1e5
    assert math.isclose(bench.zipf_hit_rate(1.0, 1000, 1.0), 1.0)


def test_a_constrained_workload_is_the_same_tables_with_the_settings_a_user_gives_torchrec(bench):
    """``--constrained``: the plain workload's tables, some with an allow-list, a fixed load factor or
    hot-set statistics, handed to every planner as TorchRec ``ParameterConstraints``."""
    given = {"sharding_types": 0, "compute_kernels": 0, "load_factor": 0, "hot_set": 0}
    for seed in range(bench.SEEDS.start, bench.SEEDS.start + 8):
        plain, constrained = bench.workload(seed), bench.workload(seed, constrained=True)
        assert constrained.name == f"{plain.name}-constrained"
        assert [replace_user(t) for t in constrained.tables] == list(plain.tables)
        constraints = bench.constraints_of(constrained, with_stats=True)
        for t in constrained.tables:
            c = constraints[t.name]
            assert c.sharding_types == (list(t.user.sharding_types) if t.user.sharding_types else None)
            assert c.compute_kernels == (list(t.user.compute_kernels) if t.user.compute_kernels else None)
            assert c.cache_params.load_factor == t.user.load_factor
            kind = bench.HotSetStats if t.user.hot_set else bench.ZipfStats
            assert isinstance(c.cache_params.stats, kind)
            for name in given:
                given[name] += getattr(t.user, name) is not None
        without = bench.constraints_of(constrained, with_stats=False)
        assert all(without[t.name].cache_params is None for t in constrained.tables if t.user.load_factor is None)
    assert all(given.values()), given


def replace_user(table):
    from dataclasses import replace

    from bench.memory_tight_bench import UserSettings

    return replace(table, user=UserSettings())


def test_hot_set_statistics_are_torchrecs_cache_statistics(bench):
    stats = bench.HotSetStats(hot=0.05, share=0.9, lookups=1e4)
    misses = [stats.expected_miss_rate(f) for f in (0.0, 0.025, 0.05, 0.5, 1.0)]
    assert misses[0] == 1.0 and misses[-1] == 0.0 and misses == sorted(misses, reverse=True)
    assert misses[1] == pytest.approx(0.55) and misses[2] == pytest.approx(0.1)  # the hot rows serve 90%
    assert 0 < stats.cacheability < 1 and stats.expected_lookups == 1e4


def test_a_weighted_workload_is_the_same_tables_with_some_in_a_weighted_bag_collection(bench):
    """``--weighted``: the plain workload's tables, about 40% of the pooled ones in a weighted
    EmbeddingBagCollection of their own, which the model every planner sees holds as weighted."""
    from rec.spec.torchrec_modules import spec_model

    moved = total = 0
    for seed in range(bench.SEEDS.start, bench.SEEDS.start + 8):
        plain, weighted = bench.workload(seed), bench.workload(seed, weighted=True)
        assert weighted.name == f"{plain.name}-weighted"
        assert [dataclasses.replace(t, weighted=False) for t in weighted.tables] == list(plain.tables)
        assert not any(t.weighted and not t.pooled for t in weighted.tables)
        spec = bench.spec_of(weighted)
        assert {t.name for t in spec.tables if t.is_weighted} == {t.name for t in weighted.tables if t.weighted}
        if any(t.weighted for t in weighted.tables):
            assert spec_model(spec).get_submodule("model.weighted_ebc").is_weighted()
        moved += sum(t.weighted for t in weighted.tables)
        total += sum(t.pooled for t in weighted.tables)
    assert 0.3 < moved / total < 0.5


def test_one_giant_cache_nearly_filling_the_hbm_rates_at_or_below_torchrecs_plan(bench):
    """--other-shapes one_giant-3214: a 2.9 TB table row_wise over 32 ranks, its cache at TorchRec's
    default size nearly filling their HBM. The heuristic packed that start badly (535 ms against 148
    after the exact stage; 163 since it also selects shards that fit beside the cache), and the exact
    stage from the fastest start alone gave 168 ms against TorchRec's 149; the exact stage also runs
    from the start at TorchRec's default size. Planned with ``timeout_seconds=20``: the plan of the
    default 30 s cap (143.09 ms against TorchRec's 149.37), sooner (14-19 s against 17-23 s, alone)."""
    w = bench.workload(3214, other=True)
    rated = rated_by_both(bench, w, shardflow_timeout_s=20)
    assert not rated["shardflow"].over_hbm_ranks
    assert rated["shardflow"].critical_path <= rated["torchrec"].critical_path


def test_a_plan_within_a_percent_of_its_bound_still_rates_at_or_below_torchrecs_when_its_model_is_small(bench):
    """A stress workload (--constrained --weighted --other-shapes, seed 9302, outside the bench's
    seeds): 8 tables on 4 ranks, the heuristic's plan within 1% of the bound, where the exact stage
    was skipped, and 0.012% slower than TorchRec's in TorchRec's units. A model this small is
    solved in moments: now the exact stage runs, and the plan rates at or below TorchRec's."""
    w = bench.workload(9302, constrained=True, weighted=True, other=True)
    rated = rated_by_both(bench, w)
    assert (len(w.tables), w.world_size) == (8, 4)
    assert rated["shardflow"].critical_path <= rated["torchrec"].critical_path


def test_a_plan_within_a_percent_of_its_bound_on_a_larger_model_still_rates_at_or_below_torchrecs():
    """A scratch probe's workload (another generator: wide tables beside narrow giant ones, its seed
    60091): 9 tables on 2 ranks, one of them cached. The plan was 0.72% above its bound, where the
    exact stage looked only at whole models of at most 150 integer columns (this one has 157), and
    TorchRec's default proposers' plan sat in that last percent: 2.8266 ms against 2.8296. The
    finished plan gets a last look (neighbourhoods of its busiest ranks, at most a second): 2.8138."""
    from bench import dropin_memory_tight_probe as probe

    def table(name, rows, dim, fp16, pooling, alpha, stats, load_factor=None, kernels=None, scalable=False):
        return probe.T(name, rows, dim, fp16, pooling, alpha, stats_kind=stats, load_factor=load_factor,
                       kernels=kernels, scalable=scalable)

    tables = [table("wide0", 11990, 2048, False, 2.0, 1.0682718298642508, "none", 0.15),
              table("wide1", 102682, 512, True, 2.0, 1.4987379522072306, "noisy"),
              table("wide2", 41248, 1280, True, 2.0, 1.42158324815443, "zipf", 0.1),
              table("wide3", 2107, 768, False, 2.0, 0.9176684646691942, "zipf", 0.15),
              table("wide4", 8950, 1536, False, 1.0, 0.8788985514995874, "noisy",
                    kernels=("fused", "fused_uvm_caching")),
              table("wide5", 135206, 1280, True, 1.0, 1.1136987238315643, "noisy"),
              table("narrow0", 52519418, 12, True, 24.88853301003594, 0.846710410222485, "offload", scalable=True),
              table("narrow1", 1196850468, 4, False, 1.0185240078360782, 0.8633071609373375, "offload", 0.9,
                    scalable=True),
              table("narrow2", 54479843, 4, True, 26.70683046915828, 1.3882875973535673, "zipf", scalable=True)]
    w = probe.W(60091, "wide_narrow", tables, world=2, local=2, hbm_gib=4.74, batch=8192,
                times_hbm=2.118, optim="rowwise_adagrad", ddr=256 * probe.GiB)
    rated = probe.plan_all(w, trec_timeout=60, sf_timeout=None, which=("shardflow", "default"))
    assert {"cp", "over"} <= set(rated["shardflow"]) and {"cp", "over"} <= set(rated["default"]), rated
    assert not rated["shardflow"]["over"]
    assert rated["shardflow"]["cp"] <= rated["default"]["cp"]


def rated_by_both(bench, w, shardflow_timeout_s=None):
    """TorchRec's rating (the bench's rater, with the statistics) of shardflow's drop-in planner's
    plan (``timeout_seconds``: ``shardflow_timeout_s``) and of TorchRec's default planner's, by planner."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from rec.spec.torchrec_modules import spec_model
    from rec.torchrec import ShardflowPlanner

    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    model = spec_model(bench.spec_of(w))
    rated = {}
    for name, planner, timeout in (("shardflow", ShardflowPlanner, shardflow_timeout_s),
                                   ("torchrec", EmbeddingShardingPlanner, None)):
        made = planner(topology=bench.torchrec_topology(w), batch_size=w.batch_size,
                       constraints=bench.constraints_of(w, True), **({"timeout_seconds": timeout} if timeout else {}))
        rated[name] = bench.rate(bench._quiet(made.plan, model, sharders), model, w, sharders, True)
    return rated


def test_where_caching_a_table_lets_a_busier_one_into_hbm_the_plan_rates_below_torchrecs_scale_up(monkeypatch):
    """Another generator's workload (bench/dropin_memory_tight_probe.py --variant floors --one 50213),
    rated by that script's own rater in TorchRec's units (no shardflow code rates): 14 tables on 8
    ranks, every one with statistics and a load factor. TorchRec's scale-up proposer caches four tables
    shardflow kept in HBM and so holds a busier one wholly in HBM: 194.32 ms against shardflow's
    196.86. The cache-size pass also searches from every table it keeps in HBM at its least cache: 188.21."""
    from bench import dropin_memory_tight_probe as probe

    monkeypatch.setattr(probe, "VARIANT", "floors")
    w = probe.workload(50213)
    rated = probe.plan_all(w, trec_timeout=60, sf_timeout=None, which=("shardflow", "scaleup"))
    assert {"cp", "over"} <= set(rated["shardflow"]) and {"cp", "over"} <= set(rated["scaleup"]), rated
    assert not rated["shardflow"]["over"]
    assert rated["shardflow"]["cp"] < rated["scaleup"]["cp"]
