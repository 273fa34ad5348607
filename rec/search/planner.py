"""The default search, chosen in one place: select options per shard limit, pack, refine."""

from __future__ import annotations

import numpy as np

from rec.cost.types import CostConfig
from rec.search.assignment import Assignment
from rec.search.bound import lower_bound
from rec.search.config import SearchConfig
from rec.search.feasibility import check_capacity_left, check_every_table_fits, packing_failure
from rec.search.candidates import best_of, candidates
from rec.search.pack import PackingError
from rec.search.refine import refine
from rec.search.result import SearchResult
from rec.search.select import shard_limits
from rec.search.switch import switch_options
from rec.search.space import SearchSpace, build_space
from rec.spec.types import Spec
from rec.topology.types import Topology


def build_search_space(spec: Spec, topology: Topology,
                       cost: CostConfig = CostConfig()) -> SearchSpace:
    """Enumerate and cost every option, and the ranks' usable capacity."""
    from rec.cost import enumerate_options, rank_capacity

    options = enumerate_options(spec, topology, cost)
    hbm_cap, ddr_cap = rank_capacity(spec, topology)
    space = build_space(options, len(spec.tables), topology.world_size,
                        topology.local_world_size, hbm_cap, ddr_cap)
    check_capacity_left(space, topology)
    check_every_table_fits(space, spec, topology.compute_device)
    return space


def candidate_limits(space: SearchSpace, config: SearchConfig) -> list[float]:
    """The ladder of largest-shard limits, from the bound up to the unconstrained choice."""
    bound = lower_bound(space)
    return shard_limits(space, bound.largest_shard or bound.value, config.shard_limits)


def search(space: SearchSpace, config: SearchConfig = SearchConfig()) -> Assignment:
    """Best assignment over the candidate selections; PackingError if none could be packed."""
    bound = lower_bound(space).value
    cands = candidates(space, candidate_limits(space, config))
    best = best_of(space, cands, config.refine_top, config.refine_rounds,
                   good_enough=(1 + config.switch_above_gap) * bound)
    return polish(space, best, config, bound)


def polish(space: SearchSpace, a: Assignment, config: SearchConfig, bound: float) -> Assignment:
    """While far enough from the bound, change tables' options and re-refine."""
    if a.critical_path > (1 + config.switch_above_gap) * bound:
        while switch_options(space, a, config.switch_steps):
            refine(space, a, config.refine_rounds)
    return a


def search_result(space: SearchSpace, config: SearchConfig = SearchConfig()) -> SearchResult:
    """Search every table of ``space`` in this process."""
    return SearchResult(space, search(space, config), lower_bound(space))


def plan_tables(spec: Spec, topology: Topology, cost: CostConfig = CostConfig(),
                config: SearchConfig = SearchConfig()) -> SearchResult:
    """Plan every table of ``spec`` on ``topology`` in this process."""
    space = build_search_space(spec, topology, cost)
    try:
        return search_result(space, config)
    except PackingError as e:
        raise packing_failure(space, spec, e.tables) from None
