"""Plan a spec end to end in the library: build the search space, search (and merge), build the Plan.

The search strategy is pluggable (a one-method protocol): the default searches in this process;
``tasks.ray_search`` provides one that runs the same search pipeline (``rec.search.pipeline``) with
its tasks on Ray actors.
"""

from __future__ import annotations

import time
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from rec import progress
from rec.analysis.build import build_plan
from rec.analysis.rank_times import predicted_critical_path
from rec.config.cost import CostConfig
from rec.config.search import SearchConfig
from rec.cost.tables import allowed_load_factors, resolved_load_factors
from rec.errors import InputError, Problem
from rec.passes import PassContext, after_search
from rec.passes.cache_sizes import FIRST_EXACT_SHARE, least_sizes, memory_decides
from rec.passes.context import RELATIVE_GAIN
from rec.plan.movement import Movement, movement
from rec.plan.plan_id import replan_keys
from rec.plan.types import Plan
from rec.profile import check_profile_for
from rec.search import SearchResult, build_search_space, search_result
from rec.search.assignment import Assignment
from rec.search.exact import combine, last_look_tasks, run_task, within
from rec.search.feasibility import packing_failure
from rec.search.least_moved import least_moved
from rec.search.pack import PackingError
from rec.search.space import SearchSpace
from rec.search.warm import MAX_REGRESS, moved_bytes, previous_placement, warm_starts
from rec.sharding import ComputeDevice
from rec.spec.types import Spec
from rec.topology.types import Topology


class Searcher(Protocol):
    """Searches a space (``rec.search.search_result``); from ``start``, its exact stage alone, which
    ``wall_s`` stops sooner than the config's time limit."""

    def search(self, space: SearchSpace, config: SearchConfig, start: Assignment | None = None,
               wall_s: float | None = None) -> SearchResult: ...


class LocalSearcher:
    """Search every table in this process."""

    def search(self, space: SearchSpace, config: SearchConfig, start: Assignment | None = None,
               wall_s: float | None = None) -> SearchResult:
        return search_result(space, config, start=start, wall_s=wall_s)


@dataclass
class ExactTime:
    """What is left of the time limit for the exact stage where the passes search again: the runs
    of one plan's searches share it. Each run is still sized from its share of the limit (its budgets
    are deterministic, so plans stay reproducible), and is stopped where the limit is spent."""

    left_s: float

    def spent(self, result: SearchResult) -> SearchResult:
        self.left_s = max(self.left_s - float(result.stats.get("exact_s", 0.0)), 0.0)
        return result


def plan_spec(spec: Spec, topology: Topology, cost: CostConfig = CostConfig(),
              config: SearchConfig = SearchConfig(), searcher: Searcher | None = None) -> Plan:
    """The plan for ``spec`` on ``topology`` (search and merge); InputError if it cannot fit, with
    every cache at its first size nor at its least (``least_caches``). ``rec.analysis.check_plan``
    validates it (the write step does, before writing). InputError too if ``cost.profile`` was
    measured on another kind of device than ``topology``'s."""
    check_profile_for(cost.profile, topology)
    result, _ = _fresh(spec, topology, cost, config, searcher)
    progress.update("building the plan")
    return build_plan(result, spec, topology, cost, config, result.info)


def _fresh(spec: Spec, topology: Topology, cost: CostConfig, config: SearchConfig,
           searcher: Searcher | None) -> tuple[SearchResult, ExactTime]:
    """``plan_spec``'s search and passes, and what they left of the exact stage's time limit."""
    clock = ExactTime(config.time_limit_s)
    try:
        return _searched(spec, topology, cost, config, searcher, clock), clock
    except InputError as refused:
        # Smaller caches leave more HBM: a spec that does not fit with every cache at its first size
        # may with each at its least, as TorchRec plans a cache at the floor a user stated.
        least = least_caches(spec, topology, cost)
        if least is None:
            raise
        progress.update("the caches at their first sizes do not fit: searching from the least sizes")
        clock = ExactTime(config.time_limit_s)
        try:
            return _searched(spec, topology, cost, config, searcher, clock, least), clock
        except InputError:
            raise refused from None


def least_caches(spec: Spec, topology: Topology, cost: CostConfig) -> np.ndarray | None:
    """(T,) the least cache size each table the planner sizes may take (its ``min_cache_load_factor``,
    else the ladder's first rung; NaN: the spec fixes it, or it cannot cache), where some is below the
    size the search starts it at; None where none is (or on cpu, without caches)."""
    if topology.compute_device is not ComputeDevice.CUDA:
        return None
    least = least_sizes(spec)
    return least if bool((least < resolved_load_factors(spec, cost)).any()) else None


def _searched(spec: Spec, topology: Topology, cost: CostConfig, config: SearchConfig, searcher: Searcher | None,
              clock: ExactTime, load_factors: np.ndarray | None = None) -> SearchResult:
    """``plan_spec``'s search and passes with the caches starting at ``load_factors`` (None: their
    first sizes), their exact stages sharing ``clock``."""
    progress.update(f"cost model: the options of {len(spec):,} tables on {topology.world_size:,} ranks")
    space = build_search_space(spec, topology, cost, load_factors)
    progress.update("searching")
    # Where memory decides, the cache-size pass searches again on other cache sizes: the full exact
    # stage waits for the sizes it ends with. A first search that packs nothing in its share of the
    # limit (the MILP's rescue) runs again with all of it.
    exact_last = memory_decides(space, topology) and config.time_limit_s > 0
    first = replace(config, time_limit_s=config.time_limit_s * FIRST_EXACT_SHARE) if exact_last else config
    try:
        result = clock.spent(_search(space, spec, first, searcher))
    except InputError:
        if not exact_last:
            raise
        exact_last = False
        result = clock.spent(_search(space, spec, config, searcher))
    result = after_search(result, _context(spec, topology, cost, config, searcher, exact_last=exact_last, clock=clock))
    return _last_look(result, config, clock)


def _last_look(result: SearchResult, config: SearchConfig, clock: ExactTime) -> SearchResult:
    """``result``, or the faster plan a last look from it finds (``last_look_tasks``: a plan within
    1% of its bound whose model was too large for the exact stage there), in what is left of the limit."""
    tasks = last_look_tasks(result.space, result.assignment, result.bound, config)
    if not tasks or clock.left_s <= 0:
        return result
    progress.update(f"a last look: best {result.critical_path:.4g} ms, bound {result.bound.value:.4g} ms")
    began = time.perf_counter()
    a, bound, stats = combine(result.assignment, result.bound,
                              (run_task(result.space, task, result.assignment, result.bound)
                               for task in within(tasks, clock.left_s)))
    # exact_s as a search states it: the clock takes what this look spent.
    looked = {**result.stats, "last_look": stats, "exact_s": time.perf_counter() - began}
    return clock.spent(replace(result, assignment=a, bound=bound, stats=looked))


def _context(spec: Spec, topology: Topology, cost: CostConfig, config: SearchConfig,
             searcher: Searcher | None, may_search: bool = True, exact_last: bool = False,
             clock: ExactTime | None = None) -> PassContext:
    """What the whole-plan passes get: they search again with ``searcher`` (None: in this process)
    unless ``may_search`` is false; with ``exact_last``, the search's exact stage is theirs to run.
    Their exact stages share what ``clock`` has left of the time limit (None: each has all of it)."""
    if not may_search:
        return PassContext(spec, topology, cost, config)
    quick = replace(config, time_limit_s=0.0)

    def timed(space: SearchSpace, share: float, start: Assignment | None = None) -> SearchResult:
        sized = replace(config, time_limit_s=config.time_limit_s * share)
        if clock is None:
            return _search(space, spec, sized, searcher, start)
        return clock.spent(_search(space, spec, sized, searcher, start, clock.left_s))

    exact = (lambda r, share: timed(r.space, share, r.assignment)) if exact_last else None
    return PassContext(spec, topology, cost, config, lambda s: timed(s, 1.0),
                       lambda s: _search(s, spec, quick, searcher), exact)


def _search(space: SearchSpace, spec: Spec, config: SearchConfig, searcher: Searcher | None,
            start: Assignment | None = None, wall_s: float | None = None) -> SearchResult:
    """The searcher's result (local by default; from ``start``, its exact stage alone, stopped after
    ``wall_s`` where given); InputError naming the tables that cannot fit."""
    try:
        return (searcher or LocalSearcher()).search(space, config, start, wall_s)
    except PackingError as e:
        raise packing_failure(space, spec, e.tables) from None


# The least-movement MILP of a replan runs for what the search from scratch left of --time-limit,
# and at least this share of it.
LEAST_MOVED_SHARE = 0.25
# Where memory decides and every candidate of a replan moves more than this share of the previous
# plan's bytes, it searches at the previous plan's cache sizes as well.
SEARCH_AT_PREVIOUS_SIZES_ABOVE = 0.1
Best = tuple[tuple[int, float], Plan, Movement]  # a replan's pick: (moved bytes, critical path), plan, movement


@dataclass(frozen=True)
class Replanned:
    plan: Plan  # replanned from the previous plan: previous_plan_id and metrics.movement set
    fresh: Plan  # searched from scratch in the same run, for comparison
    movement: Movement


def replan_spec(spec: Spec, topology: Topology, previous: Plan, max_regress: float = MAX_REGRESS,
                cost: CostConfig = CostConfig(), config: SearchConfig = SearchConfig(),
                searcher: Searcher | None = None) -> Replanned:
    """The plan for ``spec`` that moves least of ``previous``'s data while its critical path stays
    within ``(1 + max_regress)`` x that of a plan searched from scratch (``rec.search.warm``; where
    memory decides, ``plan_spec``'s plan, and ``previous``'s placement with its caches sized again is
    a candidate too; where every candidate then moves more than ``SEARCH_AT_PREVIOUS_SIZES_ABOVE`` of
    the bytes, a search at the previous cache sizes adds its own, on the whole limit again). The exact
    stages share ``config.time_limit_s``: the search from scratch's, then
    its passes' (as ``plan_spec``'s passes do), then the least-movement MILP's, which runs for what
    they left and at least ``LEAST_MOVED_SHARE`` of the limit. Each is sized from the whole limit, so
    that the replan is the same plan wherever it ends before its cap."""
    from rec.analysis import check_plan

    check_profile_for(cost.profile, topology)
    check_plan(previous, source=f"the previous plan {previous.plan_id}")
    if previous.topology.topology_hash != topology.topology_hash:
        raise InputError("Cannot replan from this previous plan:", [Problem(
            f"plan {previous.plan_id}", "was made for another topology; replan from a plan of the same "
                                        "topology, or plan from scratch (without --previous)")])
    # The previous plan's cache sizes, so that its shards fit where they are; not where the spec now
    # fixes a size, nor below a floor it now gives.
    kept = dict(zip(previous.columns.keys, previous.columns.load_factor.tolist(), strict=True))  # type: ignore[union-attr]
    sizes = allowed_load_factors(spec, np.array([kept.get(t.key, np.nan) for t in spec.tables]))
    space = build_search_space(spec, topology, cost, sizes)
    progress.update("searching from scratch")
    decides = memory_decides(space, topology)
    if decides:
        # Where memory decides, the plan from scratch is plan_spec's, its cache sizes chosen anew: the
        # previous plan's sizes can make a search from scratch far slower (bench/RESULTS.md §4). The
        # warm starts and the least-movement MILP start from it, on the sizes it chose.
        searched, clock = _fresh(spec, topology, cost, config, searcher)
        result = searched
    else:
        # The warm starts and the least-movement MILP start from the search's plan, before its passes.
        clock = ExactTime(config.time_limit_s)
        result = clock.spent(_search(space, spec, config, searcher))
        searched = after_search(result, _context(spec, topology, cost, config, searcher, clock=clock))
    fresh = build_plan(searched, spec, topology, cost, config, searched.info)
    progress.update(f"keeping shards of plan {previous.plan_id} in place")
    target = (1 + max_regress) * result.critical_path
    candidates = _least_moving_starts(result, spec, previous, cost, config, target, clock)
    extra = replan_keys(previous, max_regress, result.info)
    # Costs the search does not see (rec.passes) count: a placement within the budget shard by shard
    # may not be with them.
    budget = (1 + max_regress) * predicted_critical_path(fresh) * (1 + RELATIVE_GAIN)
    in_place = _context(spec, topology, cost, config, searcher, may_search=False)
    placements = [after_search(replace(result, assignment=a), in_place) for a in candidates]
    if decides:
        # Every shard where it was, its caches sized anew in the HBM left (a cache moves no data): from
        # the least sizes, and from the previous plan's (``space``).
        kept_in = [space]
        with suppress(InputError):  # the spec does not fit at them: no such candidate
            kept_in.insert(0, build_search_space(spec, topology, cost, least_sizes(spec)))
        placements += [after_search(r, in_place) for s in kept_in
                       for r in _kept(s, spec, cost, config, searcher, previous)]

    def least_moving(placements: list[SearchResult], best: Best | None) -> Best | None:
        for placed in placements:
            plan = build_plan(placed, spec, topology, cost, config, extra)
            if placed is not searched and predicted_critical_path(plan) > budget:
                continue
            moved = movement(previous, plan, fresh.metrics.critical_path)
            key = (moved.moved_bytes, plan.metrics.critical_path)
            if best is None or key < best[0]:
                best = (key, plan, moved)
        return best

    best = least_moving([*placements, searched], None)  # the fresh plan itself is within the budget
    assert best is not None
    if decides and best[2].moved_fraction > SEARCH_AT_PREVIOUS_SIZES_ABOVE:
        # Every placement so far moves much: search at the previous plan's cache sizes too, as a
        # replan where memory does not decide does, and keep shards in place from that plan.
        progress.update("keeping shards in place at the previous cache sizes")
        at_previous = _at_previous_sizes(space, spec, previous, cost, config, searcher, target, clock)
        best = least_moving([after_search(r, in_place) for r in at_previous], best)
    assert best is not None
    _, plan, moved = best
    plan = replace(plan, previous_plan_id=previous.plan_id,
                   metrics=replace(plan.metrics, movement=moved))
    return Replanned(plan, fresh, moved)


def _at_previous_sizes(space: SearchSpace, spec: Spec, previous: Plan, cost: CostConfig, config: SearchConfig,
                       searcher: Searcher | None, target: float, clock: ExactTime) -> list[SearchResult]:
    """Plans in ``space`` (the previous plan's cache sizes) that keep shards of ``previous`` in place:
    a search there (its exact stage on the whole time limit, as a search from scratch), its plan, and
    ``_least_moving_starts`` from it."""
    try:
        result = clock.spent(_search(space, spec, config, searcher))
    except InputError:
        return []
    found = _least_moving_starts(result, spec, previous, cost, config, target, clock)
    return [replace(result, assignment=a) for a in [*found, result.assignment]]


def _least_moving_starts(result: SearchResult, spec: Spec, previous: Plan, cost: CostConfig, config: SearchConfig,
                         target: float, clock: ExactTime) -> list[Assignment]:
    """Placements in ``result``'s space within ``target`` that keep shards of ``previous`` in place:
    the warm starts from ``result``'s plan, and the least-movement MILP's (for what ``clock`` has
    left, and at least ``LEAST_MOVED_SHARE`` of the limit) where the best of them moves any bytes."""
    space = result.space
    prev = previous_placement(space, spec, previous, cost)
    found = warm_starts(space, result.assignment, prev, target)
    incumbent = found[0] if found else result.assignment
    if moved_bytes(space, incumbent, prev) > 0:
        progress.update("least movement: MILP")
        wall_s = max(clock.left_s, config.time_limit_s * LEAST_MOVED_SHARE)
        exact = least_moved(space, prev, incumbent, target, config.time_limit_s, wall_s)
        found += [exact] if exact is not None else []
    return found


def _kept(space: SearchSpace, spec: Spec, cost: CostConfig, config: SearchConfig, searcher: Searcher | None,
          previous: Plan) -> list[SearchResult]:
    """``previous``'s placement in ``space`` (its cache sizes): its shards kept where they are (added
    tables placed around them, shards of a rank over its memory moved), whatever the critical path;
    none where the spec cannot be packed so."""
    try:
        quick = _search(space, spec, replace(config, time_limit_s=0.0), searcher)
    except InputError:
        return []
    prev = previous_placement(space, spec, previous, cost)
    return [replace(quick, assignment=a) for a in warm_starts(space, quick.assignment, prev, np.inf)]
