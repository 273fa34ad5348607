"""Each table's cache size in a plan: the planner's choice, else the spec's, else the cost model's
(at least the spec's floor)."""

from __future__ import annotations

import numpy as np

from rec.cost.tables import CachePlacement, CacheRule, implicit_caches, resolved_load_factors
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


def unstated_caches(plan: Plan, rule: CacheRule | None = None) -> np.ndarray:
    """(T,) bool in spec order: the plan's sharding plan gives the table's cache no load factor
    (``rec.cost.tables.implicit_caches``, under the plan's rule, else ``rule``)."""
    rule = plan.cache_rule if rule is None else rule
    chosen = chosen_load_factors(plan)
    return implicit_caches(plan.spec, chosen, resolved_load_factors(plan.spec, plan.planner.cost, chosen),
                           plan.planner.cost, rule, plan_placement(plan) if rule is CacheRule.PLACED else None)


def plan_placement(plan: Plan) -> CachePlacement:
    """Each table's kernel and sharding type in ``plan`` (spec order; -1 where the plan lacks it), and
    the rank of each shard of its tables that are in the spec."""
    c = plan.columns
    index = {t.key: i for i, t in enumerate(plan.spec.tables)}
    table = np.array([index.get(key, -1) for key in c.keys], np.int64)
    known = table >= 0
    kernel = np.full(len(index), -1, np.int64)
    sharding_type = np.full(len(index), -1, np.int64)
    kernel[table[known]] = c.compute_kernel[known]
    sharding_type[table[known]] = c.sharding_type[known]
    shard_table = np.repeat(table, np.diff(c.shard_start))
    return CachePlacement(kernel=kernel, sharding_type=sharding_type, shard_table=shard_table[shard_table >= 0],
                          shard_rank=c.rank[shard_table >= 0].astype(np.int64))
