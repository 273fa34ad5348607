"""Memory-tight workloads nobody tuned for: the drop-in planner against TorchRec's proposers, in TorchRec's units.

Each workload comes from one of four generators that choose nothing in shardflow (power-law sizes,
Criteo-like, a few giant tables among small ones, two towers with sequence features), with seeds
from ``SEEDS`` (3000-3999, used nowhere else), on H100-like ranks whose HBM the tables exceed 2-10
times, and per-table statistics: every table gets TorchRec ``CacheStatistics`` of Zipf-distributed
ids (exponent 0.5-1.4), as a drop-in user hands them to the planner in ``CacheParams(stats=...)``.

``--other-shapes`` draws from a second set of four generators (uniform mid-sized tables, heavy
pooling, one giant table among small ones, sequences beside pooled tables) on 2-32 ranks of 12-80
GiB and batches of 64-32768, written after the first set had been planned (seeds from 3200).

``--third-shapes`` draws from a third set of four generators (60-160 small tables beside 2-4 that
each exceed a rank's HBM, a few wide tables of 256-1024 columns, pooling factors of 1-200 with Zipf
exponents of 0.1-1.8 from near-uniform to steep, a ranking model whose tables are each 0.5-1.5 times a
rank's HBM) on 1-4 hosts of 2-8 ranks of 16-80 GiB and batches of 128-16384, written after the first
two sets had been planned, without looking at how shardflow plans (seeds 3300-3399, which ``main``
requires for it).

``--fourth-shapes`` draws from a fourth set of four generators (26 DLRM tables each of its own width,
3-14 tables of 30 M to 1 G narrow rows, 4-19 equal giants whose pooling and skew differ, sequence-heavy
models of 5-300 ids a sample) on one rank to 8 hosts of 8, of 16-141 GiB, batches of 32-65536, the
tables 1.3-12 times the ranks' HBM, and a third of the tables without statistics (the user has none
for them); written after the first three sets had been planned, without looking at how shardflow
plans (seeds 3400-3499, which ``main`` requires for it).

``--fifth-shapes`` draws from a fifth set of four generators (6-49 tables of 24-128 columns and 1 K to
100 M rows, 4-29 tables shared by 2-10 features each, 8-39 tables whose ids are either near-uniform
(Zipf 0.05-0.2) or very steep (1.8-2.5), 30-89 mid-sized tables on ranks of 4-8 GiB) on world sizes
that are not powers of two as well (3, 6, 12 ranks; 1-4 hosts), of 4-94 GiB, batches of 16-131072, the
tables 1.05-1.5 times the ranks' HBM for a third of the workloads (barely over it) and 1.5-15 times
for the rest, a fifth of the tables without statistics; written after the first four sets had been
planned, run once as a scratch script before the bench took it unchanged (seeds 3500-3599, which
``main`` requires for it). A batch large enough to leave no HBM after TorchRec's storage reservation
is a workload no planner can plan: every planner refuses it, and it counts in no ratio.

Planned by ``ShardflowPlanner`` (default settings) and TorchRec's ``EmbeddingShardingPlanner`` with
its default proposers, its ``DynamicProgrammingProposer`` and its ``EmbeddingOffloadScaleupProposer``
(the one that grows caches by cacheability), all from the same model and constraints. Every plan is
rated by one rater from the ``ShardingPlan`` it returns: TorchRec's enumerator and estimators at the
plan's own per-table cache sizes, its ranks, ``NoopPerfModel`` (the busiest rank) under TorchRec's
default profile, twice: with the statistics (TorchRec adds their prefetch term for a cache whose load
factor the plan gives) and without. A plan
over any rank's HBM after TorchRec's storage reservation is flagged.

``--constrained`` gives some tables what a user sets in ``ParameterConstraints`` (``user_settings``):
a sharding-type or kernel allow-list, a stated cache load factor (beside the statistics every table
has: the cache's floor, which TorchRec's scale-up proposer and shardflow grow, TorchRec's other
proposers keep), and statistics of a hot set of rows instead of Zipf ones; every planner gets the
same constraints. ``--weighted`` puts 40% of the pooled
tables in a weighted EmbeddingBagCollection (id-score lists, TorchRec's ``is_weighted``), which
TorchRec's estimator prices with their weights.

    .venv/bin/python bench/memory_tight_bench.py [--count 16] [--first-seed 3000] [--constrained] [--weighted] \\
        [--other-shapes | --third-shapes | --fourth-shapes | --fifth-shapes] \\
        [--shardflow-timeout SECONDS] \\
        [--out bench/results/memory_tight_bench.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from rec.spec.types import Spec
from rec.spec.validate import spec_from_rows

GiB = 2**30
SEEDS = range(3000, 4000)  # reserved for this bench: no term, probe or default was chosen on them
THIRD_SEEDS = range(3300, 3400)  # ``--third-shapes``'s part of them
FOURTH_SEEDS = range(3400, 3500)  # ``--fourth-shapes``'s
FIFTH_SEEDS = range(3500, 3600)  # ``--fifth-shapes``'s
DDR_PER_RANK = 512 * GiB


# ---------------------------------------------------------------- the workloads


def zipf_hit_rate(fraction: float, rows: int, alpha: float) -> float:
    """Share of lookups the ``fraction x rows`` hottest rows serve when ids are Zipf(``alpha``) over ``rows``."""

    def harmonic(n: float) -> float:  # generalized harmonic number, by its integral
        if n <= 1:
            return n
        return 1 + (math.log(n) if abs(alpha - 1) < 1e-9 else (n ** (1 - alpha) - 1) / (1 - alpha))

    return min(1.0, harmonic(fraction * rows) / harmonic(rows))


class Stats:
    """TorchRec's ``CacheStatistics``: the miss rate at a cache of ``clf`` of the rows (a subclass's);
    the distinct ids per batch, ``lookups``."""

    def __init__(self, lookups: float) -> None:
        self._lookups = lookups

    @property
    def expected_lookups(self) -> float:
        return self._lookups

    def expected_miss_rate(self, clf: float) -> float:
        raise NotImplementedError

    @property
    def cacheability(self) -> float:  # the mean miss rate over cache sizes: 0 easy to cache, 1 hard
        return float(np.mean([self.expected_miss_rate(f) for f in np.linspace(0.01, 1.0, 100)]))


class ZipfStats(Stats):
    """The statistics of Zipf(``alpha``) ids over ``rows``."""

    def __init__(self, rows: int, alpha: float, lookups: float) -> None:
        super().__init__(lookups)
        self.rows, self.alpha = rows, alpha

    def expected_miss_rate(self, clf: float) -> float:
        return 1.0 - zipf_hit_rate(clf, self.rows, self.alpha)


class HotSetStats(Stats):
    """The statistics of ids that are not Zipf: a hot ``hot`` share of the rows serves ``share`` of the
    lookups, uniform within the hot and within the cold rows."""

    def __init__(self, hot: float, share: float, lookups: float) -> None:
        super().__init__(lookups)
        self.hot, self.share = hot, share

    def expected_miss_rate(self, clf: float) -> float:
        if clf <= self.hot:
            return 1.0 - self.share * clf / self.hot
        return max(0.0, (1.0 - self.share) * (1.0 - (clf - self.hot) / (1.0 - self.hot)))


@dataclass(frozen=True)
class UserSettings:
    """What a drop-in user may set on a table's ``ParameterConstraints`` (``--constrained``)."""

    sharding_types: tuple[str, ...] | None = None
    compute_kernels: tuple[str, ...] | None = None
    load_factor: float | None = None  # CacheParams.load_factor: beside statistics, the cache's floor
    hot_set: tuple[float, float] | None = None  # HotSetStats (hot, share) instead of Zipf statistics


@dataclass(frozen=True)
class Table:
    name: str
    rows: int
    dim: int
    pooling: float
    fp16: bool
    alpha: float  # Zipf exponent of its ids
    features: int = 1
    pooled: bool = True
    user: UserSettings = UserSettings()
    weighted: bool = False  # in the weighted EmbeddingBagCollection (id-score lists, ``--weighted``)
    stats: bool = True  # the user hands the planner its statistics (``--fourth-shapes``: two thirds of the tables)


def _power_law(rng: np.random.Generator) -> list[Table]:
    n = int(rng.integers(20, 121))
    rows = (rng.pareto(1.1, n) + 1) * 1e5
    return [Table(f"pl{i}", int(rows[i]), int(rng.choice((16, 32, 64, 128, 256, 512))),
                  float(np.clip(rng.lognormal(1.5, 1.2), 1, 200)), bool(rng.random() < 0.5),
                  float(rng.uniform(0.5, 1.4))) for i in range(n)]


def _criteo_like(rng: np.random.Generator) -> list[Table]:
    sizes = [4e7, 4e7, 4e7, 3e7, 2e7, 1e7, 5e6, 3e6, 1e6, 6e5, 3e5, 2e5, 1e5, 5e4, 2e4, 1e4, 5e3, 3e3, 2e3, 1e3,
             600, 300, 100, 50, 20, 10]
    dim = int(rng.choice((64, 128)))
    return [Table(f"c{i}", max(4, int(s * rng.uniform(0.5, 2.0))), dim, 1.0, bool(rng.random() < 0.3),
                  float(rng.uniform(0.8, 1.3))) for i, s in enumerate(sizes)]


def _few_giants(rng: np.random.Generator) -> list[Table]:
    giants = [Table(f"g{i}", int(rng.uniform(2e7, 2e8)), int(rng.choice((64, 128, 256))),
                    float(rng.uniform(1, 60)), bool(rng.random() < 0.5), float(rng.uniform(0.5, 1.2)))
              for i in range(int(rng.integers(3, 9)))]
    small = [Table(f"s{i}", int(10 ** rng.uniform(2, 5.5)), int(rng.choice((8, 16, 32, 64))),
                   float(rng.uniform(1, 5)), False, float(rng.uniform(0.8, 1.4)))
             for i in range(int(rng.integers(10, 41)))]
    return giants + small


def _two_towers(rng: np.random.Generator) -> list[Table]:
    dim = int(rng.choice((64, 128)))
    ids = [Table("user_id", int(rng.uniform(5e7, 3e8)), dim, 1.0, True, float(rng.uniform(0.6, 1.0))),
           Table("item_id", int(rng.uniform(1e7, 1e8)), dim, 1.0, True, float(rng.uniform(0.8, 1.3))),
           Table("item_seq", int(rng.uniform(1e7, 1e8)), dim, float(rng.uniform(20, 100)), True,
                 float(rng.uniform(0.8, 1.3)), features=2, pooled=False)]
    side = [Table(f"side{i}", int(10 ** rng.uniform(3, 6.5)), int(rng.choice((16, 32, 64))),
                  float(rng.uniform(1, 10)), bool(rng.random() < 0.5), float(rng.uniform(0.6, 1.4)),
                  features=int(rng.integers(1, 3))) for i in range(int(rng.integers(10, 30)))]
    return ids + side


GENERATORS: dict[str, Callable[[np.random.Generator], list[Table]]] = {
    "power_law": _power_law, "criteo_like": _criteo_like, "few_giants": _few_giants, "two_towers": _two_towers}


# ``--other-shapes``: a second set, written after the first had been planned, to try the class
# beyond it: other table mixes, and topologies from 2 ranks to 32 with 12-80 GiB, batches 64-32768.
def _uniform_mid(rng: np.random.Generator) -> list[Table]:
    return [Table(f"u{i}", int(10 ** rng.uniform(5.5, 7)), int(rng.choice((32, 48, 64, 96, 128))),
                  float(rng.uniform(1, 30)), bool(rng.random() < 0.3), float(rng.uniform(0.7, 1.2)))
            for i in range(int(rng.integers(40, 160)))]


def _heavy_pooling(rng: np.random.Generator) -> list[Table]:
    big = [Table(f"h{i}", int(10 ** rng.uniform(6.5, 8)), int(rng.choice((64, 128, 256))),
                 float(rng.uniform(50, 400)), bool(rng.random() < 0.5), float(rng.uniform(0.6, 1.4)))
           for i in range(int(rng.integers(4, 12)))]
    return big + [Table(f"t{i}", int(10 ** rng.uniform(1, 4)), 16, 1.0, False, 1.0)
                  for i in range(int(rng.integers(2, 20)))]


def _one_giant(rng: np.random.Generator) -> list[Table]:
    giant = Table("giant", int(5e8), int(rng.choice((128, 256))), float(rng.uniform(1, 20)),
                  bool(rng.random() < 0.5), float(rng.uniform(0.5, 1.3)))
    return [giant] + [Table(f"r{i}", int(10 ** rng.uniform(4, 6.5)), int(rng.choice((16, 32, 64))),
                            float(rng.uniform(1, 8)), False, float(rng.uniform(0.8, 1.4)))
                      for i in range(int(rng.integers(5, 60)))]


def _sequences(rng: np.random.Generator) -> list[Table]:
    dim = int(rng.choice((32, 64, 128)))
    sequences = [Table(f"seq{i}", int(10 ** rng.uniform(6, 8)), dim, float(rng.uniform(10, 200)),
                       bool(rng.random() < 0.5), float(rng.uniform(0.7, 1.3)), features=int(rng.integers(1, 4)),
                       pooled=False) for i in range(int(rng.integers(2, 8)))]
    return sequences + [Table(f"p{i}", int(10 ** rng.uniform(3, 7)), int(rng.choice((16, 32, 64))),
                              float(rng.uniform(1, 20)), bool(rng.random() < 0.5), float(rng.uniform(0.6, 1.4)))
                        for i in range(int(rng.integers(5, 40)))]


OTHER_GENERATORS: dict[str, Callable[[np.random.Generator], list[Table]]] = {
    "uniform_mid": _uniform_mid, "heavy_pooling": _heavy_pooling, "one_giant": _one_giant, "sequences": _sequences}
OTHER_TOPOLOGIES = ((1, 2), (1, 8), (2, 8), (4, 8), (1, 4))  # (hosts, ranks per host)


def row_bytes(dim: int, fp16: bool) -> int:
    """A row's weights and its optimizer state, as the workloads are sized by."""
    return dim * (2 if fp16 else 4) + 4


def table_bytes(t: Table) -> int:
    return t.rows * row_bytes(t.dim, t.fp16)


# ``--third-shapes``: a third set, written after the first two had been planned, without looking at how
# shardflow plans. Its generators know the ranks: some size tables against one rank's HBM.
@dataclass(frozen=True)
class Ranks:
    hbm: int  # bytes, one rank's
    budget: int  # bytes, what the tables total: ``times_hbm`` the ranks' HBM


def _rows_of(size: float, dim: int, fp16: bool) -> int:
    return max(1, int(size / row_bytes(dim, fp16)))


def _many_small(rng: np.random.Generator, ranks: Ranks) -> list[Table]:
    """Many small tables (TorchRec issue 2282's shape, 60-160 of them: at 500, TorchRec's default planner
    alone took minutes a workload) beside 2-4 that each exceed a rank's HBM."""
    small = [Table(f"m{i}", int(10 ** rng.uniform(4, 6)), int(rng.choice((16, 32, 48, 64, 96, 128))),
                   float(np.clip(rng.lognormal(0.7, 0.8), 1, 30)), bool(rng.random() < 0.5),
                   float(rng.uniform(0.6, 1.3))) for i in range(int(rng.integers(60, 161)))]
    wanted = int(rng.integers(2, 5))
    giants = max(1, min(wanted, int(ranks.budget / (1.25 * ranks.hbm))))
    floor = giants * 1.2 * ranks.hbm  # every giant at least 1.2x a rank's HBM
    small_bytes = sum(table_bytes(t) for t in small)
    if small_bytes > ranks.budget - floor:  # the small tables shrink so that the giants stay giants
        f = (ranks.budget - floor) / small_bytes
        small = [replace(t, rows=max(1_000, int(t.rows * f))) for t in small]
        small_bytes = sum(table_bytes(t) for t in small)
    shares = rng.dirichlet(np.ones(giants))
    spare = max(0.0, ranks.budget - small_bytes - floor)
    out = []
    for i in range(giants):
        dim, fp16 = int(rng.choice((64, 128, 256))), bool(rng.random() < 0.5)
        out.append(Table(f"giant{i}", _rows_of(1.2 * ranks.hbm + shares[i] * spare, dim, fp16), dim,
                         float(rng.uniform(1, 30)), fp16, float(rng.uniform(0.5, 1.2))))
    return out + small


def _wide_dims(rng: np.random.Generator, ranks: Ranks) -> list[Table]:
    """A few large tables of 256-1024 columns, a few small wide ones beside them."""
    wide = [Table(f"w{i}", int(10 ** rng.uniform(6, 7.5)), int(rng.choice((256, 384, 512, 768, 1024))),
                  float(rng.uniform(1, 40)), bool(rng.random() < 0.5), float(rng.uniform(0.5, 1.3)))
            for i in range(int(rng.integers(3, 9)))]
    return wide + [Table(f"ws{i}", int(10 ** rng.uniform(3, 4.7)), int(rng.choice((256, 512))),
                         float(rng.uniform(1, 5)), bool(rng.random() < 0.5), float(rng.uniform(0.8, 1.3)))
                   for i in range(int(rng.integers(0, 5)))]


def _mixed_skew(rng: np.random.Generator, ranks: Ranks) -> list[Table]:
    """Pooling factors from 1 to 200, and Zipf exponents from near-uniform (0.1-0.4) to steep (1.1-1.8)."""
    def alpha() -> float:
        regime = rng.random()
        return float(rng.uniform(0.1, 0.4) if regime < 0.35 else rng.uniform(0.6, 1.0) if regime < 0.7
                     else rng.uniform(1.1, 1.8))

    return [Table(f"x{i}", int(10 ** rng.uniform(5, 7.5)), int(rng.choice((32, 64, 128))),
                  float(10 ** rng.uniform(0, math.log10(200))), bool(rng.random() < 0.5), alpha())
            for i in range(int(rng.integers(15, 61)))]


def _ranking_hbm(rng: np.random.Generator, ranks: Ranks) -> list[Table]:
    """A ranking model whose large tables are each 0.5-1.5 times one rank's HBM, beside small feature tables."""
    small = [Table(f"f{i}", int(10 ** rng.uniform(2, 4.9)), int(rng.choice((8, 16, 32))), float(rng.uniform(1, 5)),
                   False, float(rng.uniform(0.8, 1.4))) for i in range(int(rng.integers(10, 51)))]
    left = ranks.budget - sum(table_bytes(t) for t in small)
    large: list[Table] = []
    while left > 0:  # the last one overshoots by under 1.5x HBM, which the workload's scaling takes back
        dim, fp16 = int(rng.choice((64, 128, 256))), bool(rng.random() < 0.5)
        t = Table(f"r{len(large)}", _rows_of(rng.uniform(0.5, 1.5) * ranks.hbm, dim, fp16), dim,
                  float(rng.uniform(1, 40)), fp16, float(rng.uniform(0.6, 1.3)))
        large.append(t)
        left -= table_bytes(t)
    return large + small


THIRD_GENERATORS: dict[str, Callable[[np.random.Generator, Ranks], list[Table]]] = {
    "many_small": _many_small, "wide_dims": _wide_dims, "mixed_skew": _mixed_skew, "ranking_hbm": _ranking_hbm}
THIRD_TOPOLOGIES = ((1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (2, 8), (4, 4), (4, 8))  # (hosts, ranks per host)


# ``--fourth-shapes``: a fourth set, written after the first three had been planned, without looking at
# how shardflow plans: a third of the tables come without statistics, from one rank to 64.
def _dlrm_mixed(rng: np.random.Generator) -> list[Table]:
    """26 tables of 100 to 100 M rows, each of its own width (16-256), pooling 1-3."""
    return [Table(f"d{i}", int(10 ** rng.uniform(2, 8)), int(rng.choice((16, 32, 64, 128, 256))),
                  float(rng.uniform(1, 3)), bool(rng.random() < 0.5), float(rng.uniform(0.4, 1.5)))
            for i in range(26)]


def _huge_rows_narrow(rng: np.random.Generator) -> list[Table]:
    """3-14 tables of 30 M to 1 G rows 8-32 wide, beside up to 30 tiny ones."""
    return [Table(f"n{i}", int(10 ** rng.uniform(7.5, 9)), int(rng.choice((8, 16, 24, 32))),
                  float(rng.uniform(1, 15)), bool(rng.random() < 0.7), float(rng.uniform(0.6, 1.3)))
            for i in range(int(rng.integers(3, 15)))] + [
            Table(f"k{i}", int(10 ** rng.uniform(2, 5)), int(rng.choice((8, 16))), 1.0, False, 1.0)
            for i in range(int(rng.integers(0, 30)))]


def _equal_giants(rng: np.random.Generator) -> list[Table]:
    """4-19 tables of one size and width, their pooling 1-50 and Zipf exponents 0.3-1.6 apart."""
    dim, count, rows = int(rng.choice((64, 128))), int(rng.integers(4, 20)), int(10 ** rng.uniform(7, 8.5))
    return [Table(f"e{i}", rows, dim, float(rng.uniform(1, 50)), bool(rng.random() < 0.5), float(rng.uniform(0.3, 1.6)))
            for i in range(count)]


def _sequence_heavy(rng: np.random.Generator) -> list[Table]:
    """5-39 tables with 5-300 ids a sample over 1-4 features each, 60% of them unpooled (one width)."""
    unpooled_dim = int(rng.choice((32, 64, 128)))
    out = []
    for i in range(int(rng.integers(5, 40))):
        rows, pooled = int(10 ** rng.uniform(5, 8)), bool(rng.random() < 0.4)
        out.append(Table(f"q{i}", rows, int(rng.choice((32, 64, 128))) if pooled else unpooled_dim,
                         float(rng.uniform(5, 300)), bool(rng.random() < 0.5), float(rng.uniform(0.5, 1.5)),
                         features=int(rng.integers(1, 5)), pooled=pooled))
    return out


FOURTH_GENERATORS: dict[str, Callable[[np.random.Generator], list[Table]]] = {
    "dlrm_mixed": _dlrm_mixed, "huge_rows_narrow": _huge_rows_narrow, "equal_giants": _equal_giants,
    "sequence_heavy": _sequence_heavy}
FOURTH_TOPOLOGIES = ((1, 1), (1, 2), (1, 8), (2, 4), (8, 8), (1, 16))  # (hosts, ranks per host)


# ``--fifth-shapes``: a fifth set, written after the first four had been planned and taken unchanged
# from the scratch script that ran it first: world sizes that are not powers of two, small HBM,
# tables shared by many features, extreme skews, tables barely over the HBM.
def _odd_mix(rng: np.random.Generator) -> list[Table]:
    """6-49 tables of 1 K to 100 M rows, 24-128 columns (some not powers of two), pooling 1-25."""
    return [Table(f"o{i}", int(10 ** rng.uniform(3, 8)), int(rng.choice((24, 40, 64, 80, 128))),
                  float(rng.uniform(1, 25)), bool(rng.random() < 0.5), float(rng.uniform(0.5, 1.4)))
            for i in range(int(rng.integers(6, 50)))]


def _multi_feature(rng: np.random.Generator) -> list[Table]:
    """4-29 tables, each shared by 2-10 features."""
    return [Table(f"mf{i}", int(10 ** rng.uniform(4, 8)), int(rng.choice((32, 64, 128))),
                  float(rng.uniform(1, 20)), bool(rng.random() < 0.5), float(rng.uniform(0.6, 1.3)),
                  features=int(rng.integers(2, 11))) for i in range(int(rng.integers(4, 30)))]


def _skew_extremes(rng: np.random.Generator) -> list[Table]:
    """8-39 tables whose ids are near-uniform (Zipf 0.05-0.2) or very steep (1.8-2.5), half each."""
    return [Table(f"sx{i}", int(10 ** rng.uniform(5, 8)), int(rng.choice((32, 64, 128, 256))),
                  float(10 ** rng.uniform(0, 2)), bool(rng.random() < 0.5),
                  float(rng.uniform(0.05, 0.2) if rng.random() < 0.5 else rng.uniform(1.8, 2.5)))
            for i in range(int(rng.integers(8, 40)))]


def _small_hbm_many(rng: np.random.Generator) -> list[Table]:
    """30-89 tables of 100 K to 10 M rows (on ranks of 4-8 GiB)."""
    return [Table(f"sh{i}", int(10 ** rng.uniform(5, 7)), int(rng.choice((32, 64, 96, 128))),
                  float(rng.uniform(1, 40)), bool(rng.random() < 0.5), float(rng.uniform(0.5, 1.3)))
            for i in range(int(rng.integers(30, 90)))]


FIFTH_GENERATORS: dict[str, Callable[[np.random.Generator], list[Table]]] = {
    "odd_mix": _odd_mix, "multi_feature": _multi_feature, "skew_extremes": _skew_extremes,
    "small_hbm_many": _small_hbm_many}
FIFTH_TOPOLOGIES = ((1, 3), (1, 6), (2, 3), (2, 6), (1, 12), (3, 4), (1, 2), (4, 2))  # (hosts, ranks per host)


@dataclass(frozen=True)
class Workload:
    name: str
    tables: tuple[Table, ...]
    world_size: int
    local_world_size: int
    hbm_gib: int
    batch_size: int
    times_hbm: float


def workload(seed: int, constrained: bool = False, weighted: bool = False, other: bool = False,
             third: bool = False, fourth: bool = False, fifth: bool = False) -> Workload:
    """Seed ``seed``'s workload: a generator, a topology, and the tables scaled to ``times_hbm`` the ranks'
    HBM; ``constrained``: the same tables, some with a user's settings (``user_settings``);
    ``weighted``: the same tables, 40% of the pooled ones in a weighted EmbeddingBagCollection;
    ``other``: from the second set of generators and topologies (``OTHER_GENERATORS``); ``third``: from the
    third (``THIRD_GENERATORS``), whose generators are told the ranks, drawn first; ``fourth``: from the
    fourth (``FOURTH_GENERATORS``), a third of its tables without statistics; ``fifth``: from the fifth
    (``FIFTH_GENERATORS``), a fifth of its tables without statistics."""
    if other + third + fourth + fifth > 1:
        raise ValueError("a workload comes from one set of generators")
    rng = np.random.default_rng(seed)
    if fifth:
        kind = list(FIFTH_GENERATORS)[seed % len(FIFTH_GENERATORS)]
        hosts, local = FIFTH_TOPOLOGIES[int(rng.integers(len(FIFTH_TOPOLOGIES)))]
        hbm = int(rng.choice((4, 6, 8) if kind == "small_hbm_many" else (12, 24, 48, 94)))
        batch = int(rng.choice((16, 128, 1024, 8192, 131072)))
        barely = rng.random() < 0.3
        times = float(min(rng.uniform(1.05, 1.5) if barely else rng.uniform(1.5, 15.0),
                          0.5 * DDR_PER_RANK / (hbm * GiB)))
        w = _sized(seed, kind, FIFTH_GENERATORS[kind](rng), hosts * local, local, hbm, batch, times, constrained,
                   weighted)
        return _without_stats(w, np.random.default_rng([seed, 5]), 0.2)
    if fourth:
        kind = list(FOURTH_GENERATORS)[seed % len(FOURTH_GENERATORS)]
        hosts, local = FOURTH_TOPOLOGIES[int(rng.integers(len(FOURTH_TOPOLOGIES)))]
        hbm = int(rng.choice((16, 40, 80, 141)))
        batch = int(rng.choice((32, 256, 4096, 65536)))
        times = float(min(rng.uniform(1.3, 12.0), 0.5 * DDR_PER_RANK / (hbm * GiB)))
        w = _sized(seed, kind, FOURTH_GENERATORS[kind](rng), hosts * local, local, hbm, batch, times, constrained,
                   weighted)
        return _without_stats(w, np.random.default_rng([seed, 3]), 1 / 3)
    if third:
        kind = list(THIRD_GENERATORS)[seed % len(THIRD_GENERATORS)]
        hosts, local = THIRD_TOPOLOGIES[int(rng.integers(len(THIRD_TOPOLOGIES)))]
        hbm = int(rng.choice((16, 24, 40, 80)))
        batch = int(rng.choice((128, 512, 2048, 8192, 16384)))
        times = float(min(rng.uniform(2.0, 12.0), 0.5 * DDR_PER_RANK / (hbm * GiB)))
        tables = THIRD_GENERATORS[kind](rng, Ranks(hbm * GiB, int(times * hosts * local * hbm * GiB)))
        return _sized(seed, kind, tables, hosts * local, local, hbm, batch, times, constrained, weighted)
    generators = OTHER_GENERATORS if other else GENERATORS
    kind = list(generators)[seed % len(generators)]
    tables = generators[kind](rng)
    if other:
        hosts, local = OTHER_TOPOLOGIES[int(rng.integers(len(OTHER_TOPOLOGIES)))]
        hbm = int(rng.choice((12, 16, 32, 80)))
        batch = int(rng.choice((64, 256, 2048, 16384, 32768)))
        least, most = 2.0, 12.0
    else:
        hosts, local = [(1, 8), (2, 8), (1, 4)][int(rng.integers(3))]
        hbm = int(rng.choice((8, 16, 24, 40)))
        batch = int(rng.choice((512, 1024, 2048, 4096, 8192)))
        least, most = 2.0, 10.0
    world = hosts * local
    times = float(min(rng.uniform(least, most), 0.5 * DDR_PER_RANK / (hbm * GiB)))
    return _sized(seed, kind, tables, world, local, hbm, batch, times, constrained, weighted)


def _sized(seed: int, kind: str, tables: list[Table], world: int, local: int, hbm: int, batch: int, times: float,
           constrained: bool, weighted: bool) -> Workload:
    """The workload of ``tables`` grown to ``times`` the ranks' HBM, with a user's settings and weights."""
    big = [t for t in tables if t.rows >= 100_000]  # small tables keep their size: a vocabulary is what it is
    spare = times * world * hbm * GiB - sum(table_bytes(t) for t in tables if t.rows < 100_000)
    scale = spare / sum(table_bytes(t) for t in big)
    grown = tuple(Table(t.name, max(1, int(t.rows * scale)), t.dim, t.pooling, t.fp16, t.alpha, t.features, t.pooled)
                  if t.rows >= 100_000 else t for t in tables)
    if constrained:
        settings = np.random.default_rng([seed, 1])
        grown = tuple(replace(t, user=user_settings(settings, t)) for t in grown)
    if weighted:
        scored = np.random.default_rng([seed, 2])
        grown = tuple(replace(t, weighted=t.pooled and bool(scored.random() < 0.4)) for t in grown)
    name = f"{kind}-{seed}" + ("-constrained" if constrained else "") + ("-weighted" if weighted else "")
    return Workload(name, grown, world, local, hbm, batch, times)


def _without_stats(w: Workload, rng: np.random.Generator, share: float) -> Workload:
    """``w`` with about ``share`` of its tables, drawn by ``rng``, without statistics."""
    return replace(w, tables=tuple(replace(t, stats=bool(rng.random() >= share)) for t in w.tables))


def user_settings(rng: np.random.Generator, t: Table) -> UserSettings:
    """A table's settings as users give them: half the tables hot-set statistics; 15% a sharding-type
    allow-list, 10% a kernel allow-list, 7% of the large ones a stated cache load factor."""
    pick, stats, hot, share = rng.random(), rng.random(), rng.uniform(0.01, 0.2), rng.uniform(0.6, 0.99)
    load_factor = float(rng.choice((0.05, 0.1, 0.3)))
    user = UserSettings(hot_set=(float(hot), float(share)) if stats < 0.5 else None)
    if pick < 0.15:
        return replace(user, sharding_types=("table_wise", "row_wise"))
    if pick < 0.25:
        return replace(user, compute_kernels=("fused", "fused_uvm_caching"))
    if pick < 0.32 and t.rows >= 100_000:
        return replace(user, load_factor=load_factor)
    return user


def spec_of(w: Workload) -> Spec:
    rows = []
    for t in w.tables:
        rows.append({"name": t.name, "num_embeddings": t.rows, "embedding_dim": t.dim, "pooling_factor": t.pooling,
                     "data_type": "FP16" if t.fp16 else "FP32", "pooling": "SUM" if t.pooled else "NONE",
                     "feature_names": [f"{t.name}_f{j}" for j in range(t.features)],
                     "module": "model.weighted_ebc" if t.weighted else "model.ebc" if t.pooled else "model.ec",
                     **({"is_weighted": True} if t.weighted else {})})
    return spec_from_rows(rows, source=w.name)


# ---------------------------------------------------------------- planning and rating


def _quiet(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    finally:
        logging.disable(disabled)


def constraints_of(w: Workload, with_stats: bool) -> dict[str, Any]:
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    out = {}
    for t in w.tables:
        lookups = w.batch_size * w.world_size * t.pooling * t.features
        distinct = t.rows * (1 - math.exp(-lookups / t.rows))  # an upper bound on the distinct ids, uniform draws
        stats: Stats | None = None
        if with_stats and t.stats:
            stats = HotSetStats(*t.user.hot_set, distinct) if t.user.hot_set else ZipfStats(t.rows, t.alpha, distinct)
        given = stats is not None or t.user.load_factor is not None
        out[t.name] = ParameterConstraints(
            pooling_factors=[t.pooling] * t.features,
            sharding_types=list(t.user.sharding_types) if t.user.sharding_types else None,
            compute_kernels=list(t.user.compute_kernels) if t.user.compute_kernels else None,
            cache_params=CacheParams(load_factor=t.user.load_factor, stats=stats) if given else None)
    return out


def torchrec_topology(w: Workload) -> Any:
    from torchrec.distributed.planner.types import Topology

    return Topology(world_size=w.world_size, local_world_size=w.local_world_size, compute_device="cuda",
                    hbm_cap=w.hbm_gib * GiB, ddr_cap=DDR_PER_RANK)


@dataclass(frozen=True)
class Rating:
    critical_path: float  # ms, NoopPerfModel: the busiest rank
    over_hbm_ranks: tuple[int, ...]
    cached_tables: int  # fused_uvm_caching tables
    mean_load_factor: float  # over them


def rate(plan: Any, model: Any, w: Workload, sharders: list[Any], with_stats: bool) -> Rating:
    """TorchRec's rating of a ``ShardingPlan``: each table's option enumerated at the plan's cache size,
    its shards on the plan's ranks."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
    from torchrec.distributed.types import CacheParams

    from rec.torchrec.score import plan_options

    constraints = constraints_of(w, with_stats)
    factors = []
    for module_plan in plan.plan.values():
        for name, p in module_plan.items():
            if p.compute_kernel == "fused_uvm_caching":
                given = p.cache_params.load_factor if p.cache_params else None
                factors.append(0.2 if given is None else given)  # FBGEMM's default where none is given
                old = constraints[name].cache_params
                # As TorchRec rates it: with no load factor given, it prices no fetches.
                constraints[name] = replace(constraints[name], cache_params=CacheParams(
                    load_factor=given, stats=old.stats if old else None))
    topology = torchrec_topology(w)
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=w.batch_size, constraints=constraints, estimator=[
        EmbeddingPerfEstimator(topology, constraints), EmbeddingStorageEstimator(topology, constraints)])
    options = _quiet(enumerator.enumerate, model, sharders)
    reserved = _quiet(HeuristicalStorageReservation(percentage=0.15).reserve, topology, w.batch_size, model,
                      sharders, constraints)
    perf, hbm = [0.0] * w.world_size, [0] * w.world_size
    for option in plan_options(plan, options):
        for shard in option.shards:
            perf[shard.rank] += shard.perf.total
            hbm[shard.rank] += shard.storage.hbm
    over = tuple(r for r in range(w.world_size) if hbm[r] > reserved.devices[r].storage.hbm)
    return Rating(max(perf), over, len(factors), float(np.mean(factors)) if factors else 0.0)


def plan_all(w: Workload, timeout_s: int, shardflow_timeout_s: float | None = None) -> dict[str, Any]:
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.proposers import (
        DynamicProgrammingProposer,
        EmbeddingOffloadScaleupProposer,
        GreedyProposer,
    )

    from rec.spec.torchrec_modules import spec_model
    from rec.torchrec import ShardflowPlanner

    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    model = spec_model(spec_of(w))
    planners: dict[str, Callable[[dict[str, Any]], Any]] = {
        "shardflow": lambda c: ShardflowPlanner(topology=torchrec_topology(w), batch_size=w.batch_size, constraints=c,
                                                timeout_seconds=shardflow_timeout_s),
        "torchrec_default": lambda c: EmbeddingShardingPlanner(
            topology=torchrec_topology(w), batch_size=w.batch_size, constraints=c, timeout_seconds=timeout_s),
        "torchrec_dp": lambda c: EmbeddingShardingPlanner(
            topology=torchrec_topology(w), batch_size=w.batch_size, constraints=c, timeout_seconds=timeout_s,
            proposer=DynamicProgrammingProposer()),
        "torchrec_scaleup": lambda c: EmbeddingShardingPlanner(
            topology=torchrec_topology(w), batch_size=w.batch_size, constraints=c, timeout_seconds=timeout_s,
            proposer=[GreedyProposer(), EmbeddingOffloadScaleupProposer()]),
    }
    out: dict[str, Any] = {}
    for name, make in planners.items():
        started = time.perf_counter()
        planner = make(constraints_of(w, True))
        try:
            plan = _quiet(planner.plan, model, sharders)
        except Exception as e:  # a planner that finds no plan is a result, not a crash of the bench
            out[name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
            continue
        seconds = time.perf_counter() - started
        stats, plain = rate(plan, model, w, sharders, True), rate(plan, model, w, sharders, False)
        out[name] = {"seconds": seconds, "critical_path": stats.critical_path,
                     "critical_path_without_stats": plain.critical_path, "over_hbm_ranks": list(stats.over_hbm_ranks),
                     "cached_tables": stats.cached_tables, "mean_load_factor": stats.mean_load_factor}
        if isinstance(planner, ShardflowPlanner):  # its own rating: TorchRec's, statistics included
            out[name]["own_critical_path"] = planner.last_plan.metrics.critical_path
    return out


def summary(w: Workload, result: dict[str, Any]) -> dict[str, Any]:
    """Shardflow's critical path over TorchRec's best plan that fits, with and without the statistics."""
    ours = result["shardflow"]
    row: dict[str, Any] = {"workload": w.name, "tables": len(w.tables), "ranks": w.world_size, "hbm_gib": w.hbm_gib,
                           "batch": w.batch_size, "times_hbm": round(w.times_hbm, 2)}
    theirs = {k: v for k, v in result.items() if k != "shardflow" and "error" not in v and not v["over_hbm_ranks"]}
    if "error" in ours or not theirs:
        row["ratio"] = row["ratio_without_stats"] = None
        return row
    for key, field in (("ratio", "critical_path"), ("ratio_without_stats", "critical_path_without_stats")):
        best = min(v[field] for v in theirs.values())
        row[key] = ours[field] / best
    row["best_torchrec"] = min(theirs, key=lambda k: theirs[k]["critical_path"])
    row["shardflow_over_hbm"] = bool(ours["over_hbm_ranks"])
    row["own_is_torchrecs"] = abs(ours["own_critical_path"] - ours["critical_path"]) <= 1e-9 * ours["critical_path"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=16, help="workloads, seeds 3000 on (default 16: 4 of each generator)")
    p.add_argument("--first-seed", type=int, default=SEEDS.start)
    p.add_argument("--constrained", action="store_true",
                   help="tables carry a user's settings too: sharding-type and kernel allow-lists, fixed cache load "
                        "factors, hot-set statistics instead of Zipf ones (user_settings)")
    p.add_argument("--weighted", action="store_true",
                   help="40%% of the pooled tables in a weighted EmbeddingBagCollection (id-score lists, is_weighted)")
    p.add_argument("--other-shapes", action="store_true",
                   help="the second set of generators (uniform mid-sized tables, heavy pooling, one giant table, "
                        "sequences) on 2-32 ranks of 12-80 GiB, batches 64-32768; run it on seeds from 3200")
    p.add_argument("--third-shapes", action="store_true",
                   help="the third set of generators (60-160 small tables beside 2-4 over a rank's HBM, wide "
                        "dims, pooling 1-200 with near-uniform to steep Zipf ids, ranking tables of 0.5-1.5x a "
                        "rank's HBM) on 1-4 hosts of 2-8 ranks of 16-80 GiB, batches 128-16384; seeds 3300-3399")
    p.add_argument("--fourth-shapes", action="store_true",
                   help="the fourth set of generators (26 DLRM tables of mixed widths, huge narrow tables, equal "
                        "giants, sequence-heavy models), a third of the tables without statistics, on 1-64 ranks "
                        "of 16-141 GiB, batches 32-65536, 1.3-12x HBM; seeds 3400-3499")
    p.add_argument("--fifth-shapes", action="store_true",
                   help="the fifth set of generators (mixed tables of odd widths, tables shared by 2-10 features, "
                        "near-uniform or very steep ids, many mid-sized tables on 4-8 GiB ranks), on 2-12 ranks "
                        "(3, 6 and 12 too) of 4-94 GiB, batches 16-131072, 1.05-15x HBM, a fifth of the tables "
                        "without statistics; seeds 3500-3599")
    p.add_argument("--timeout", type=int, default=300, help="TorchRec planner timeout_seconds (default 300)")
    p.add_argument("--shardflow-timeout", type=float, default=None, metavar="SECONDS",
                   help="ShardflowPlanner's timeout_seconds, the cap of its exact stage (default: its own, 30)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "memory_tight_bench.json",
                   help="the results as JSON (default bench/results/memory_tight_bench.json)")
    args = p.parse_args(argv)
    if args.other_shapes + args.third_shapes + args.fourth_shapes + args.fifth_shapes > 1:
        p.error("--other-shapes, --third-shapes, --fourth-shapes and --fifth-shapes are sets of generators: give one")
    for given, flag, seeds in ((args.third_shapes, "--third-shapes", THIRD_SEEDS),
                               (args.fourth_shapes, "--fourth-shapes", FOURTH_SEEDS),
                               (args.fifth_shapes, "--fifth-shapes", FIFTH_SEEDS)):
        if given and not (args.first_seed in seeds and args.first_seed + args.count - 1 in seeds):
            p.error(f"{flag} takes seeds {seeds.start}-{seeds.stop - 1}: not "
                    f"{args.first_seed}-{args.first_seed + args.count - 1}")
    logging.disable(logging.WARNING)  # TorchRec's advice on how the bench builds its topology and reservation
    warnings.simplefilter("ignore")
    rows, raw = [], []
    for seed in range(args.first_seed, args.first_seed + args.count):
        if seed not in SEEDS:
            p.error(f"seed {seed} is outside the bench's reserved range {SEEDS.start}-{SEEDS.stop - 1}")
        w = workload(seed, args.constrained, args.weighted, args.other_shapes, args.third_shapes, args.fourth_shapes,
                     args.fifth_shapes)
        result = plan_all(w, args.timeout, args.shardflow_timeout)
        row = summary(w, result)
        rows.append(row)
        raw.append({"workload": row, "planners": result})
        brief = " ".join(f"{k}=error" if "error" in v else f"{k}={v['critical_path']:.4g}"
                         + ("(over)" if v["over_hbm_ranks"] else "") for k, v in result.items())
        print(f"{w.name:>18} {len(w.tables):>3} tables {w.world_size:>2}x{w.hbm_gib}GiB b{w.batch_size:<5} "
              f"x{w.times_hbm:.1f} HBM  ratio {row['ratio'] if row['ratio'] is None else round(row['ratio'], 3)}  "
              f"{brief}", flush=True)
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    plain = [r["ratio_without_stats"] for r in rows if r["ratio_without_stats"] is not None]
    if ratios:
        print(f"shardflow / TorchRec's best, with statistics: median {statistics.median(ratios):.3f}, "
              f"max {max(ratios):.3f}; without: median {statistics.median(plain):.3f}, max {max(plain):.3f}; "
              f"{sum(r > 1 + 1e-9 for r in ratios)} of {len(ratios)} above 1; shardflow's own critical path is "
              f"TorchRec's rating (1e-9) on {sum(r.get('own_is_torchrecs', False) for r in rows)} of {len(ratios)}, "
              f"over HBM on {sum(r.get('shardflow_over_hbm', False) for r in rows)}")
    args.out.write_text(json.dumps(raw, indent=1, default=str) + "\n", encoding="utf-8")
    by_kind: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["ratio"] is not None:
            by_kind[r["workload"].split("-", 1)[0]].append(r["ratio"])
    for kind, values in by_kind.items():
        print(f"  {kind}: {', '.join(f'{v:.3f}' for v in values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
