"""Memory priced into time: the Lagrangian relaxation of "one option per table, memory within
the ranks' total, minimise the slowest rank", shared by the lower bound and the memory-aware
candidate selections.

For prices ``lam`` (per HBM byte) and ``mu`` (per DDR byte) an option costs
``work + lam * hbm + mu * ddr``. Any plan whose slowest rank is at most ``z`` picks, per table, an
option whose largest shard is at most ``z``, puts at most ``W * z`` work on the ``W`` ranks and
stays within the total HBM ``H`` and DDR ``D``; so

    g(z) = sum over tables of the least priced cost among options with largest shard <= z
           - lam * H - mu * D  <=  W * z.

Where ``g(z) > W * z`` no plan reaches ``z``: the least ``z`` that passes is a lower bound for
every choice of prices (weak duality), and its supremum over prices is the LP relaxation's value.
Per table the options are kept sorted by largest shard, so ``g`` is a step function evaluated for
all ``z`` at once in O(options).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import IntEnum

import numpy as np

from rec.search.space import SearchSpace, table_starts

# The search for a price: from ``price_scale`` up by PRICE_GROWTH until the price is high enough
# (none above MAX_PRICE, ms per byte), then PRICE_STEPS bisection steps in log space (relative
# precision 2**-40 of the bracket). When the first price tried is already high enough, the
# bisection starts BISECT_RANGE below it.
PRICE_GROWTH = 16
MAX_PRICE = 1e30
PRICE_STEPS = 40
BISECT_RANGE = 1e-12
MIN_PRICE_SCALE = 1e-30


class Resource(IntEnum):
    """The memory a price is for; the values index the (HBM, DDR) pairs below."""

    HBM = 0
    DDR = 1

    @property
    def other(self) -> Resource:
        return Resource.DDR if self is Resource.HBM else Resource.HBM


@dataclass(frozen=True)
class Prices:
    hbm: float = 0.0  # ms per byte
    ddr: float = 0.0

    def of(self, resource: Resource) -> float:
        return self.hbm if resource is Resource.HBM else self.ddr

    def with_price(self, resource: Resource, price: float) -> Prices:
        """These prices with ``resource``'s set to ``price``."""
        return replace(self, hbm=price) if resource is Resource.HBM else replace(self, ddr=price)


def least_price(too_low: Callable[[float], bool], scale: float) -> float:
    """The least price at which ``too_low`` turns false (it must be true below some price and
    false above), to PRICE_STEPS bisection steps; inf when even MAX_PRICE is too low. ``scale``:
    the first price tried."""
    lo, hi = 0.0, scale
    while too_low(hi):
        lo, hi = hi, hi * PRICE_GROWTH
        if hi > MAX_PRICE:
            return np.inf
    lo = lo or hi * BISECT_RANGE
    for _ in range(PRICE_STEPS):
        mid = float(np.sqrt(lo * hi))
        lo, hi = (mid, hi) if too_low(mid) else (lo, mid)
    return hi


class PricedTables:
    """Each table's feasible options as a dense (tables, options) block sorted by largest shard."""

    def __init__(self, space: SearchSpace):
        opts = space.options
        starts = table_starts(space)
        counts = np.diff(np.append(starts, opts.num_options))
        t = opts.table.astype(np.int64)
        width = int(counts.max()) if len(counts) else 0
        option = np.full((space.num_tables, width), -1, dtype=np.int64)
        option[t, np.arange(len(t)) - starts[t]] = np.arange(len(t))
        pad = option < 0
        idx = np.where(pad, 0, option)
        ms = np.where(pad | ~space.feasible[idx], np.inf, space.max_shard[idx])
        order = np.argsort(ms, axis=1, kind="stable")  # each table's options by largest shard
        rows = np.arange(space.num_tables)[:, None]
        self.option = np.where(np.isinf(ms), -1, option)[rows, order]
        idx, self.max_shard = idx[rows, order], ms[rows, order]
        self.work = np.where(np.isinf(self.max_shard), np.inf, space.work[idx])
        self.hbm = opts.total(opts.hbm).astype(float)[idx]
        self.ddr = opts.total(opts.ddr).astype(float)[idx]
        self.world_size = space.world_size
        self.hbm_cap = float(space.hbm_cap.sum())
        self.ddr_cap = float(space.ddr_cap.sum())
        n = space.num_tables
        self.largest_shard = float(self.max_shard[:, 0].max()) if n else 0.0
        self.average_work = float(self.work.min(axis=1).sum()) / self.world_size if n else 0.0
        # No plan is below either simple bound, so g is needed only from there on: options with
        # larger shards are the steps of g, in one fixed order whatever the prices.
        self.floor = max(self.largest_shard, self.average_work)
        later = np.isfinite(self.max_shard) & (self.max_shard > self.floor)
        self.before = self.max_shard <= self.floor
        self.steps = np.flatnonzero(later.ravel())
        self.steps = self.steps[np.argsort(self.max_shard.ravel()[self.steps], kind="stable")]
        self.step_at = self.max_shard.ravel()[self.steps]

    def cost(self, prices: Prices) -> np.ndarray:
        c = self.work + prices.hbm * self.hbm + prices.ddr * self.ddr
        return np.where(np.isinf(self.work), np.inf, c)

    def least_z(self, prices: Prices) -> float:
        """The least ``z`` with ``g(z) <= W * z`` at these prices: a lower bound on the critical path."""
        if not self.option.size:
            return 0.0
        best = np.minimum.accumulate(self.cost(prices), axis=1)
        last = self.before.sum(axis=1) - 1  # before-positions come first in each row
        g0 = best[np.arange(len(best)), last].sum() - prices.hbm * self.hbm_cap - prices.ddr * self.ddr_cap
        drop = (best - np.concatenate((best[:, :1], best[:, :-1]), axis=1)).ravel()[self.steps]
        drop = np.where(np.isfinite(drop), drop, 0.0)
        g = g0 + np.concatenate(([0.0], np.cumsum(drop)))
        start = np.concatenate(([self.floor], self.step_at))
        end = np.append(self.step_at, np.inf)
        z = np.maximum(start, g / self.world_size)
        return float(z[np.argmax(z < end)])

    def select(self, prices: Prices, limit: float) -> np.ndarray:
        """Per table the option of least priced cost with largest shard within ``limit`` (the
        option with the smallest largest shard where none is)."""
        c = np.where(self.max_shard <= limit, self.cost(prices), np.inf)
        k = np.argmin(c, axis=1)
        k[~np.isfinite(c.min(axis=1))] = 0
        return np.asarray(self.option[np.arange(len(k)), k])

    def usage(self, choice_k: np.ndarray) -> tuple[float, float]:
        """Total HBM and DDR of a selection given as (table, column) positions (index it by ``Resource``)."""
        rows = np.arange(len(choice_k))
        return float(self.hbm[rows, choice_k].sum()), float(self.ddr[rows, choice_k].sum())

    def _select_k(self, prices: Prices, limit: float) -> np.ndarray:
        c = np.where(self.max_shard <= limit, self.cost(prices), np.inf)
        k = np.argmin(c, axis=1)
        k[~np.isfinite(c.min(axis=1))] = 0
        return np.asarray(k)

    def over(self, prices: Prices, limit: float) -> tuple[float, float]:
        """How far the priced selection within ``limit`` exceeds the total HBM and DDR (bytes;
        index it by ``Resource``)."""
        hbm, ddr = self.usage(self._select_k(prices, limit))
        return hbm - self.hbm_cap, ddr - self.ddr_cap

    def price_for(self, resource: Resource, share: float, limit: float, other: Prices = Prices()) -> float:
        """The least price of ``resource`` whose selection within ``limit`` uses at most ``share``
        of the ranks' total of it (the other price as in ``other``); inf if none does."""
        budget = share * (self.hbm_cap, self.ddr_cap)[resource]

        def too_low(p: float) -> bool:
            return self.usage(self._select_k(other.with_price(resource, p), limit))[resource] > budget

        if not too_low(0.0):
            return 0.0
        return least_price(too_low, self.price_scale(resource))

    def price_scale(self, resource: Resource) -> float:
        """A price where one byte costs about as much time as the average byte's share of work."""
        mem = (self.hbm, self.ddr)[resource]
        work = np.where(np.isfinite(self.work), self.work, 0.0)
        total = float(mem[:, 0].sum())
        return max(float(work[:, 0].sum()) / total, MIN_PRICE_SCALE) if total > 0 else 1.0
