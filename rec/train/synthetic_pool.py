"""How many synthetic batches the measuring job draws up front: enough that every fused_uvm_caching
table's cache sees a stream of ids as training gives it, not a few batches it holds whole.

A cached table keeps ``load_factor x rows`` of its rows in HBM. A pool of a few cycled batches
touches few rows: once they all sit in the cache nearly every lookup hits, and the measurement
flatters the kernel. The automatic pool is the smallest (at least ``MIN_POOL`` batches) over which
every cached table's ids, all ranks' together (each rank draws its own pool and the table's shards
serve them all), touch in expectation (``rec.cost.unique.expected_touched``) ``TOUCH_FACTOR`` times
the rows its cache holds, or ``REACH`` of the rows its ids can touch where that is less (a large
cache, or a curve that leaves rows untouched). Two caps bound it: ``MAX_POOL`` batches and
``POOL_BYTES`` of ids per rank (the pool sits in HBM beside the plan's tables, which the plan did
not budget for). Fixed caps rather than the free memory: every rank must size the same pool, or the
ranks' blocks would differ. The byte cap wins over ``MIN_POOL``: batches so large that ``MIN_POOL``
of them exceed it make a pool of fewer, down to one (however large that one is). The fewer the
batches, the fewer rows their ids touch: a cache that holds them all hits on nearly every lookup
after the first pass (with one batch, every lookup after the first iteration), so the measurement
flatters fused_uvm_caching tables; the pool then says so (``reached`` false, ``touched_over_cache``).
Without cached tables (cpu) the pool's size matters only for the memory it takes.
No torch here: tests and the report read it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rec.cost.unique import expected_touched
from rec.hit_rates import Curve
from rec.plan.load_factors import load_factors
from rec.plan.types import Plan
from rec.sharding import ComputeDevice, ComputeKernel

TOUCH_FACTOR = 4.0  # rows touched over the pool / rows the cache holds
REACH = 0.9  # ... or this share of the rows the table's ids can touch, where that is less
MIN_POOL = 4  # unless POOL_BYTES allows fewer only
MAX_POOL = 256
POOL_BYTES = 2 << 30  # per rank: the pool's ids, weights, lengths and offsets
SAMPLE_BYTES = 12  # per sample and feature: its int32 length and int64 offset
ID_BYTES = 8  # int64 ids
WEIGHT_BYTES = 4  # a weighted table's float32 weight per id


@dataclass(frozen=True)
class CachedTable:
    """What sizing needs of one fused_uvm_caching table."""

    key: str
    rows: int
    cache_rows: float  # the cache's load factor x rows
    lookups: float  # the table's ids in one batch, all ranks together
    curve: Curve | None = None  # its hit_rate_curve; None: the skew model

    def touched(self, batches: int) -> float:
        """Expected distinct rows the ids of ``batches`` batches touch."""
        return float(expected_touched(batches * self.lookups, self.rows, self.curve))

    @property
    def target(self) -> float:
        """Rows the pool should touch: ``TOUCH_FACTOR`` x the cache's, or ``REACH`` of the reachable."""
        reachable = float(expected_touched(math.inf, self.rows, self.curve))
        return min(TOUCH_FACTOR * self.cache_rows, REACH * reachable)


@dataclass(frozen=True)
class Pool:
    """The synthetic batches a rank draws and cycles, and what they give the caches."""

    batches: int
    touched_over_cache: float | None = None  # smallest over the cached tables; None: no cached table
    reached: bool | None = None  # every cached table touches its target; None: no cached table

    @property
    def fill_iterations(self) -> int:
        """Iterations after which every cache has seen at least its rows (the rows touched grow
        concavely with the batches, so 1 / TOUCH_FACTOR of a pool reaching its target does); 0
        without cached tables."""
        return math.ceil(self.batches / TOUCH_FACTOR) if self.reached is not None else 0


def pool_of(tables: Sequence[CachedTable], batches: int) -> Pool:
    """``batches`` batches and what they give ``tables``."""
    if not tables:
        return Pool(batches)
    ratio = min(t.touched(batches) / max(t.cache_rows, 1.0) for t in tables)
    reached = all(t.touched(batches) >= t.target * (1 - 1e-9) for t in tables)
    return Pool(batches, ratio, reached)


def pool_size(tables: Sequence[CachedTable], batch_bytes: float, *, budget: float = POOL_BYTES,
              most: int = MAX_POOL) -> Pool:
    """The smallest pool, from ``MIN_POOL`` batches up to the caps (``most``, ``budget`` bytes of
    ``batch_bytes`` each: fewer than ``MIN_POOL`` where the budget holds fewer, never under one),
    over which every table touches its target."""
    cap = max(1, min(most, int(budget // max(batch_bytes, 1.0))))
    least = min(MIN_POOL, cap)
    needed = max((_batches_for(t, least, cap) for t in tables), default=least)
    return pool_of(tables, min(needed, cap))


def _batches_for(table: CachedTable, least: int, cap: int) -> int:
    """The fewest batches in [least, cap] whose ids touch ``table``'s target (``cap`` if none do):
    ``touched`` grows with the batches, so a bisection."""
    target = table.target * (1 - 1e-9)
    lo, hi = least, cap
    if table.touched(lo) >= target:
        return lo
    while lo + 1 < hi:  # touched(lo) short, and hi reaches it or is the cap
        mid = (lo + hi) // 2
        if table.touched(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def cached_tables(plan: Plan) -> list[CachedTable]:
    """The plan's fused_uvm_caching tables (none on cpu: no cache there), each cache holding the
    load factor the job builds it with (``rec.plan.load_factors``: the plan's, else the spec's, else
    the cost model's ``caching_ratio`` raised to the spec's floor)."""
    if plan.topology.compute_device is not ComputeDevice.CUDA:
        return []
    cached = {t.key for t in plan.tables if t.compute_kernel is ComputeKernel.FUSED_UVM_CACHING}
    ranks_batch = plan.world_size * plan.topology.batch_size
    return [CachedTable(t.key, t.num_embeddings, float(factor) * t.num_embeddings,
                        ranks_batch * t.pooling_factor * len(t.feature_names), t.hit_rate_curve)
            for t, factor in zip(plan.spec.tables, load_factors(plan), strict=True) if t.key in cached]


def batch_bytes(plan: Plan) -> float:
    """About the bytes one rank's synthetic batch takes on the device: every feature's ids (and a
    weighted table's weights), lengths and offsets."""
    per_sample = sum(len(t.feature_names) * ((ID_BYTES + (WEIGHT_BYTES if t.is_weighted else 0)) * t.pooling_factor
                                             + SAMPLE_BYTES) for t in plan.spec.tables)
    return float(plan.topology.batch_size * per_sample)


def synthetic_pool(plan: Plan, requested: int) -> Pool:
    """The pool the measuring job draws for ``plan``: ``requested`` batches, or sized as the module
    says when ``requested`` is 0 (auto)."""
    tables = cached_tables(plan)
    if requested:
        return pool_of(tables, requested)
    return pool_size(tables, batch_bytes(plan))
