"""A provable lower bound on the critical path of any plan over the same options.

Bounds, weakest to strongest, each valid on its own; a plan reports the largest and names it:

* ``largest_shard``: some rank carries the largest shard of every table's chosen option;
* ``average_work``: the ranks share at least every table's least work;
* ``lagrangian``: both coupled (an option counts only if its largest shard fits under the bound)
  and memory priced in: the LP relaxation of the plan problem with the ranks' memory pooled,
  through its Lagrangian dual (``rec.search.pricing``); cheap at 100,000 tables;
* ``milp``: the dual bound of the exact stage (``rec.search.exact``), where it ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from rec.search.pricing import PRICE_STEPS, PricedTables, Prices
from rec.search.space import SearchSpace, table_starts

# Rounds of alternating HBM and DDR price searches when both resources bind.
PRICE_ROUNDS = 3


class BoundMethod(StrEnum):
    """How the reported lower bound was proven (plan.json ``metrics.bound_method``)."""

    LARGEST_SHARD = "largest_shard"
    AVERAGE_WORK = "average_work"
    LAGRANGIAN = "lagrangian"
    MILP = "milp"


@dataclass(frozen=True)
class LowerBound:
    value: float
    method: BoundMethod
    average_work: float  # least total work of all tables / world size
    largest_shard: float  # the largest shard some table cannot avoid
    lagrangian: float = 0.0  # the priced bound (>= both above)
    prices: Prices = field(default_factory=Prices)  # the memory prices that proved it

    def improved(self, value: float, method: BoundMethod) -> LowerBound:
        """This bound or ``value`` (proven by ``method``), whichever is larger."""
        return replace(self, value=value, method=method) if value > self.value else self


def per_table_min(space: SearchSpace, values: np.ndarray) -> np.ndarray:
    """For each table, the least of ``values`` over its feasible options (inf if none)."""
    return np.minimum.reduceat(np.where(space.feasible, values, np.inf), table_starts(space)).astype(float)


def lower_bound(space: SearchSpace, priced: PricedTables | None = None) -> LowerBound:
    """The best of the bounds above that need no solver."""
    priced = priced or PricedTables(space)
    average, largest = priced.average_work, priced.largest_shard
    z, prices = memory_bound(priced)
    value, method = largest, BoundMethod.LARGEST_SHARD
    for v, m in ((average, BoundMethod.AVERAGE_WORK), (z, BoundMethod.LAGRANGIAN)):
        if v > value * (1 + 1e-12):
            value, method = v, m
    return LowerBound(value, method, average, largest, z, prices)


def memory_bound(priced: PricedTables) -> tuple[float, Prices]:
    """The largest ``least_z`` found over memory prices, and those prices.

    Validity does not depend on finding the best prices (every price proves its own bound); the
    search bisects each overused resource's price on the sign of its overuse at the bound, in
    turns while both need a price."""
    prices = Prices()
    best = (priced.least_z(prices), prices)
    for _ in range(PRICE_ROUNDS):
        searched = False
        for axis in (0, 1):
            over = priced.over(prices, priced.least_z(prices))
            if over[axis] > 0 or (over[1 - axis] > 0 and _price(prices, axis) > 0):
                prices, z = _best_price(priced, axis, prices)
                searched = True
                if z > best[0]:
                    best = (z, prices)
        if not searched:
            break
    return best


def _price(prices: Prices, axis: int) -> float:
    return prices.hbm if axis == 0 else prices.ddr


def _best_price(priced: PricedTables, axis: int, prices: Prices) -> tuple[Prices, float]:
    """Bisect the price of HBM (axis 0) or DDR (axis 1), the other held: raise it while the
    selection at the price's own bound overuses that resource."""

    def at(p: float) -> Prices:
        return Prices(p, prices.ddr) if axis == 0 else Prices(prices.hbm, p)

    def probe(p: float) -> tuple[float, bool]:
        z = priced.least_z(at(p))
        return z, priced.over(at(p), z)[axis] > 0

    best_z, best_p = probe(0.0)[0], 0.0
    lo, hi = 0.0, priced.price_scale(axis)
    while True:
        z, over = probe(hi)
        if z > best_z:
            best_z, best_p = z, hi
        if not over or hi > 1e30:
            break
        lo, hi = hi, hi * 16
    lo = lo or hi * 1e-12
    for _ in range(PRICE_STEPS):
        mid = float(np.sqrt(lo * hi))
        z, over = probe(mid)
        if z > best_z:
            best_z, best_p = z, mid
        lo, hi = (mid, hi) if over else (lo, mid)
    return at(best_p), best_z

