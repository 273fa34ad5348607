"""After the search: which caches the plan's ShardingPlan gives no size, now that its tables are placed.

The search costs a cache at TorchRec's default size as stated (its fetches priced, where TorchRec
prices them) wherever a table that may share its kernel group is sized otherwise, and every cache
once the planner chose a size (``rec.cost.tables.CacheRule.GROUP``): where the tables go is not known
yet. Once they are placed, only a cache of another size in the same kernel group (TorchRec groups one
sharding type's fused_uvm_caching tables rank by rank) keeps it stated (``CacheRule.PLACED``); the
others go unstated, as in TorchRec's own plans, and TorchRec prices no fetches for them. Their tables
are costed again: the plan only gets faster, and its lower bound is that of its options costed so
(one the MILP proved for the search's costs no longer holds). So are the options of tables a search
gave a cache size that ended without a cache: the plan records none for them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rec.config.cost import CostConfig
from rec.cost.tables import CachePlacement, CacheRule, implicit_caches, resolved_load_factors
from rec.search.assignment import Assignment, chosen_shards, usage
from rec.search.bound import BoundMethod, lower_bound
from rec.search.pipeline import recosted_space, unstated_of
from rec.search.result import SearchResult
from rec.search.space import SearchSpace
from rec.sharding import CK_CODE, ComputeKernel
from rec.spec.types import Spec
from rec.topology.types import Topology


def assignment_placement(space: SearchSpace, assignment: Assignment) -> CachePlacement:
    """Each table's kernel and sharding type in ``assignment``, and the rank of each of its shards."""
    opts, choice = space.options, assignment.choice
    entries = chosen_shards(space, choice)
    repeat = opts.repeat[entries].astype(np.int64)
    runs = np.repeat(np.arange(len(entries)), repeat)
    within = np.arange(len(runs)) - np.repeat(np.cumsum(repeat) - repeat, repeat)
    return CachePlacement(kernel=opts.compute_kernel[choice], sharding_type=opts.sharding_type[choice],
                          shard_table=opts.table[space.entry_owner[entries]][runs].astype(np.int64),
                          shard_rank=(assignment.shard_rank[entries][runs] + within).astype(np.int64))


def with_placed_caches(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig) -> SearchResult:
    """``result`` costed as its plan records it: its fused_uvm_caching tables' caches stated as its
    ShardingPlan states them, the cache sizes of its other tables dropped."""
    space, a = result.space, result.assignment
    caching, searched, factors, placed, flipped = _restated(result, spec, cost)
    dropped = ~caching & ~np.isnan(searched)
    if not flipped.any() and not dropped.any():
        return result
    recosted = recosted_space(space, spec, topology, cost, factors, np.flatnonzero(flipped | dropped),
                              unstated=placed)
    assignment = usage(recosted, a.choice, a.shard_rank)
    bound = lower_bound(recosted)
    if result.bound.method is BoundMethod.MILP and not flipped.any():
        # A dropped size changes no placed shard's cost: the MILP's bound stands where it is the larger.
        bound = bound.improved(result.bound.value, BoundMethod.MILP)
    return replace(result, space=recosted, assignment=assignment, bound=bound)


def placed_critical_path(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig) -> float:
    """``with_placed_caches(result, ...).critical_path``, costing nothing again where no cache's
    statement changes (a dropped size changes no placed shard's cost)."""
    if not _restated(result, spec, cost)[-1].any():
        return result.critical_path
    return with_placed_caches(result, spec, topology, cost).critical_path


def _restated(result: SearchResult, spec: Spec, cost: CostConfig
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(T,) each: the tables ``result`` caches, the cache sizes its search gave, those its plan records
    (the cached tables' only), the caches its ShardingPlan leaves unstated, and the cached ones among
    them whose statement differs from the search's."""
    space, a = result.space, result.assignment
    caching = space.options.compute_kernel[a.choice] == CK_CODE[ComputeKernel.FUSED_UVM_CACHING]
    searched = np.full(len(spec.tables), np.nan) if space.chosen_load_factor is None else space.chosen_load_factor
    factors = np.where(caching, searched, np.nan)
    placed = implicit_caches(spec, factors, resolved_load_factors(spec, cost, factors), cost, CacheRule.PLACED,
                             assignment_placement(space, a))
    return caching, searched, factors, placed, caching & (placed != unstated_of(space, spec, cost))
