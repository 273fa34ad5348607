"""The default search, chosen in one place: select options per shard limit, pack, refine."""

from __future__ import annotations

import numpy as np

from rec.cost.types import CostConfig
from rec.search.assignment import Assignment
from rec.search.bound import lower_bound
from rec.search.config import SearchConfig
from rec.search.feasibility import check_every_table_fits, packing_failure
from rec.search.pack import PackingError, PackOrder, pack
from rec.search.placement import FREE, HOST_FREE
from rec.search.refine import refine
from rec.search.result import SearchResult
from rec.search.select import select_options, shard_limits
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
    check_every_table_fits(space, spec, topology.compute_device)
    return space


def search(space: SearchSpace, config: SearchConfig = SearchConfig(),
           start: Assignment | None = None, ladder_bound: float | None = None) -> Assignment:
    """Best assignment over the candidate selections; PackingError if none could be packed.

    ``start`` holds load already on the ranks (e.g. the other table groups); ``ladder_bound``
    replaces this space's own bound as the smallest shard limit tried."""
    bound = lower_bound(space)
    least = ladder_bound if ladder_bound is not None else (bound.largest_shard or bound.value)
    limits = shard_limits(space, least, config.shard_limits)
    # With few tables, whole shards placed freely can balance better than options that load
    # every rank (replicas, row splits), even at more total work.
    whole = (space.placement == FREE) | (space.placement == HOST_FREE)
    candidates = [select_options(space, limit, allowed=allowed)
                  for allowed in (None, whole) for limit in limits]
    candidates.append(select_options(space, np.inf, cost=_total_hbm(space)))
    packed: list[Assignment] = []
    seen: set[bytes] = set()
    failure = PackingError([])
    for choice in candidates:
        key = choice.tobytes()
        if key in seen:
            continue
        seen.add(key)
        for order in PackOrder:
            try:
                packed.append(pack(space, choice, order, start=None if start is None else start.copy()))
                break
            except PackingError as e:
                failure = e
    if not packed:
        raise failure
    # Local search is the expensive part: spend it on the candidates that packed best.
    packed.sort(key=lambda a: a.critical_path)
    refined = [refine(space, a, config.refine_rounds) for a in packed[:config.refine_top]]
    best = min(refined, key=lambda a: a.critical_path)
    if best.critical_path > (1 + config.switch_above_gap) * bound.value:
        while switch_options(space, best, config.switch_steps):
            refine(space, best, config.refine_rounds)
    return best


def _total_hbm(space: SearchSpace) -> np.ndarray:
    return np.add.reduceat(space.options.hbm, space.options.shard_start[:-1]).astype(float)


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
