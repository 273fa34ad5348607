"""``bench/memory_tight_bench.py``'s workloads: memory-tight for real, valid, from every generator, on
seeds reserved apart from the ones the model and the out-of-family set were chosen on."""

from __future__ import annotations

import math

import pytest


@pytest.fixture(scope="module")
def bench():
    from bench import memory_tight_bench

    return memory_tight_bench


def test_every_workload_holds_its_tables_several_times_over_the_hbm_and_within_the_ddr(bench):
    from bench.gpu_check.families import OOF_SEEDS

    assert not set(bench.SEEDS) & set(OOF_SEEDS)
    kinds = set()
    for seed in range(bench.SEEDS.start, bench.SEEDS.start + 12):
        w = bench.workload(seed)
        kinds.add(w.name.rsplit("-", 1)[0])
        spec = bench.spec_of(w)  # a valid spec: spec_from_rows names every problem
        weights = sum(t.num_embeddings * t.embedding_dim * t.data_type.bytes_per_element for t in spec.tables)
        hbm = w.world_size * w.hbm_gib * bench.GiB
        assert 1.9 * hbm < weights <= 0.5 * w.world_size * bench.DDR_PER_RANK, w.name
    assert kinds == set(bench.GENERATORS)


def test_zipf_statistics_are_torchrecs_cache_statistics(bench):
    stats = bench.ZipfStats(rows=10_000_000, alpha=0.9, lookups=1e5)
    misses = [stats.expected_miss_rate(f) for f in (0.0, 0.01, 0.1, 0.5, 1.0)]
    assert misses[0] == 1.0 and misses[-1] == 0.0 and misses == sorted(misses, reverse=True)
    assert 0 < stats.cacheability < 1 and stats.expected_lookups == 1e5
    assert math.isclose(bench.zipf_hit_rate(1.0, 1000, 1.0), 1.0)
