"""The default search, chosen in one place: bound, candidate selections, packing, refinement,
then the exact stage."""

from __future__ import annotations

from rec import progress
from rec.cost.types import CostConfig
from rec.search.assignment import Assignment
from rec.search.bound import LowerBound, lower_bound
from rec.search.candidates import Ladder, best_of, candidates, priced_steps
from rec.search.config import SearchConfig
from rec.search.exact import improve, rescue
from rec.search.feasibility import check_capacity_left, check_every_table_fits
from rec.search.pack import PackingError
from rec.search.pricing import PricedTables
from rec.search.refine import refine
from rec.search.result import SearchResult
from rec.search.select import shard_limits
from rec.search.space import SearchSpace, build_space
from rec.search.switch import switch_options
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


def prepare(space: SearchSpace, config: SearchConfig) -> tuple[LowerBound, Ladder]:
    """The bound and the ladder of candidate selections, computed once for all tables."""
    priced = PricedTables(space)
    bound = lower_bound(space, priced)
    limits = shard_limits(space, bound.largest_shard or bound.value, config.shard_limits)
    return bound, Ladder(tuple(limits), priced_steps(priced, bound))


def heuristic(space: SearchSpace, config: SearchConfig, bound: LowerBound, ladder: Ladder) -> Assignment:
    """Best assignment over the candidate selections; PackingError if none could be packed."""
    best = best_of(space, candidates(space, ladder), config.refine_top, config.refine_rounds,
                   good_enough=(1 + config.switch_above_gap) * bound.value)
    return polish(space, best, config, bound.value)


def first_plan(space: SearchSpace, config: SearchConfig, bound: LowerBound, ladder: Ladder) -> Assignment:
    """The heuristic's plan, or the MILP's when no candidate packs; PackingError if neither."""
    try:
        return heuristic(space, config, bound, ladder)
    except PackingError as e:
        return rescued(space, config, bound, e)


def rescued(space: SearchSpace, config: SearchConfig, bound: LowerBound, failure: PackingError) -> Assignment:
    """When no candidate packs: the MILP's first plan, refined; ``failure`` again if it has none."""
    a = rescue(space, bound, config)
    if a is None:
        raise failure
    return polish(space, refine(space, a, config.refine_rounds), config, bound.value)


def polish(space: SearchSpace, a: Assignment, config: SearchConfig, bound: float) -> Assignment:
    """While far enough from the bound, change tables' options and re-refine."""
    if a.critical_path > (1 + config.switch_above_gap) * bound:
        while switch_options(space, a, config.switch_steps):
            refine(space, a, config.refine_rounds)
    return a


def search_result(space: SearchSpace, config: SearchConfig = SearchConfig()) -> SearchResult:
    """Search every table of ``space`` in this process: heuristic, then the exact stage."""
    bound, ladder = prepare(space, config)
    progress.update(f"heuristic: {len(ladder.limits)} shard limits, bound {bound.value:.4g} ms")
    a = first_plan(space, config, bound, ladder)
    progress.update(f"exact stage: best {a.critical_path:.4g} ms, bound {bound.value:.4g} ms")
    a, bound, stats = improve(space, a, bound, config)
    return SearchResult(space, a, bound, stats=stats)


def search(space: SearchSpace, config: SearchConfig = SearchConfig()) -> Assignment:
    """The assignment ``search_result`` finds."""
    return search_result(space, config).assignment
