"""After the search: which caches the plan's ShardingPlan gives no size, now that its tables are placed.

The search costs a cache at TorchRec's default size as stated (its fetches priced, where TorchRec
prices them) wherever a table that may share its kernel group is sized otherwise
(``rec.cost.tables.CacheRule.GROUP``): where the tables go is not known yet. Once they are placed, only
a cache of another size in the same kernel group (TorchRec groups one sharding type's
fused_uvm_caching tables rank by rank) keeps it stated (``CacheRule.PLACED``); the others go unstated,
as in TorchRec's own plans, and TorchRec prices no fetches for them. Their tables are costed again: the
plan only gets faster, and its lower bound is that of its options costed so.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rec.config.cost import CostConfig
from rec.cost.tables import CachePlacement, CacheRule, implicit_caches, resolved_load_factors
from rec.search.assignment import Assignment, chosen_shards, usage
from rec.search.bound import lower_bound
from rec.search.pipeline import recosted_space, unstated_of
from rec.search.result import SearchResult
from rec.search.space import SearchSpace
from rec.sharding import CK_CODE, ComputeKernel
from rec.spec.types import Spec
from rec.topology.types import Topology


def placement(space: SearchSpace, assignment: Assignment) -> CachePlacement:
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
    """``result`` with its fused_uvm_caching tables costed as its ShardingPlan states their caches."""
    space, a = result.space, result.assignment
    if space.unstated is not None:
        return result  # costed so already
    chosen = space.chosen_load_factor
    placed = implicit_caches(spec, chosen, resolved_load_factors(spec, cost, chosen), cost, CacheRule.PLACED,
                             placement(space, a))
    caching = space.options.compute_kernel[a.choice] == CK_CODE[ComputeKernel.FUSED_UVM_CACHING]
    changed = np.flatnonzero(caching & (placed != unstated_of(space, spec, cost)))
    if not len(changed):
        return result
    factors = np.full(len(spec.tables), np.nan) if chosen is None else chosen
    recosted = recosted_space(space, spec, topology, cost, factors, changed, unstated=placed)
    assignment = usage(recosted, a.choice, a.shard_rank)
    return replace(result, space=recosted, assignment=assignment, bound=lower_bound(recosted))
