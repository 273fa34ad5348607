"""Each table's cache size in a plan: the planner's choice, else the spec's, else the cost model's
(at least the spec's floor)."""

from __future__ import annotations

import numpy as np

from rec.cost.tables import implicit_caches, resolved_load_factors
from rec.plan.types import Plan


def chosen_load_factors(plan: Plan) -> np.ndarray:
    """(T,) in spec order: each table's ``cache_load_factor`` in the plan, NaN where it has none."""
    c = plan.columns
    assert c.load_factor is not None
    if np.isnan(c.load_factor).all():
        return np.full(len(plan.spec.tables), np.nan)
    position = {key: i for i, key in enumerate(c.keys)}
    return np.array([c.load_factor[position[t.key]] if t.key in position else np.nan for t in plan.spec.tables])


def load_factors(plan: Plan) -> np.ndarray:
    """(T,) in spec order: the share of each table's rows a fused_uvm_caching cache holds in ``plan``."""
    return resolved_load_factors(plan.spec, plan.planner.cost, chosen_load_factors(plan))


def unstated_caches(plan: Plan, every_stated: bool | None = None) -> np.ndarray:
    """(T,) bool in spec order: the plan's sharding plan gives the table's cache no load factor
    (``rec.cost.tables.implicit_caches``, under the rule of the plan's format, else ``every_stated``'s)."""
    chosen = chosen_load_factors(plan)
    return implicit_caches(plan.spec, chosen, resolved_load_factors(plan.spec, plan.planner.cost, chosen),
                           plan.planner.cost,
                           every_stated=plan.every_cache_stated if every_stated is None else every_stated)
