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

import numpy as np

from rec.plan.metrics import BoundMethod
from rec.search.pricing import PricedTables, Prices, Resource, least_price
from rec.search.space import SearchSpace, table_starts
from rec.tolerance import TIME_NOISE

# Rounds of alternating HBM and DDR price searches when both resources bind.
PRICE_ROUNDS = 3


__all__ = ["BoundMethod", "LowerBound", "lower_bound", "per_table_min"]


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
        if v > value * (1 + TIME_NOISE):
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
        for resource in Resource:
            over = priced.over(prices, priced.least_z(prices))
            if over[resource] > 0 or (over[resource.other] > 0 and prices.of(resource) > 0):
                prices, z = _best_price(priced, resource, prices)
                searched = True
                if z > best[0]:
                    best = (z, prices)
        if not searched:
            break
    return best


def _best_price(priced: PricedTables, resource: Resource, prices: Prices) -> tuple[Prices, float]:
    """Search the price of ``resource``, the other held: raise it while the selection at the
    price's own bound overuses that resource; the prices and bound of the best price tried."""
    best = (priced.least_z(prices.with_price(resource, 0.0)), 0.0)

    def too_low(p: float) -> bool:
        nonlocal best
        at = prices.with_price(resource, p)
        z = priced.least_z(at)
        if z > best[0]:
            best = (z, p)
        return priced.over(at, z)[resource] > 0

    least_price(too_low, priced.price_scale(resource))
    return prices.with_price(resource, best[1]), best[0]

