"""The search, one pipeline for every backend: the bound and the ladder of candidate selections,
a first plan (the heuristic over all tables, or table groups searched apart and merged), then the
exact stage.

Where the tasks run is the mapper's choice (``rec.search.mapper``): in this process by default,
on Ray actors with ``tasks.ray_search``. Every task is a pure function of the search space and its
item, so every mapper finds the same plan.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

import numpy as np

from rec import progress
from rec.config.cost import CostConfig
from rec.config.search import SearchConfig
from rec.cost.types import Options
from rec.errors import InputError, Problem
from rec.search.assignment import Assignment
from rec.search.bound import LowerBound
from rec.search.candidates import Ladder
from rec.search.exact import combine, exact_tasks, run_task, within
from rec.search.feasibility import check_capacity_left, check_every_table_fits
from rec.search.group import search_group, split_groups
from rec.search.heuristic import first_plan, prepare, rescued
from rec.search.mapper import InProcess, Mapper
from rec.search.merge import merge_groups
from rec.search.pack import PackingError
from rec.search.result import SearchResult
from rec.search.space import SearchSpace, build_space
from rec.spec.types import Spec
from rec.topology.types import Topology

__all__ = ["build_search_space", "prepare", "search", "search_result"]


def build_search_space(spec: Spec, topology: Topology, cost: CostConfig = CostConfig(),
                       load_factors: np.ndarray | None = None, *, unstated: np.ndarray | None = None) -> SearchSpace:
    """Enumerate and cost every option, and the ranks' usable capacity; ``load_factors`` (spec order,
    NaN: none) are cache sizes a plan chose; ``unstated``: (T,) the caches a plan gives no size
    (``rec.plan.load_factors.unstated_caches``; default: as before tables are placed)."""
    from rec.cost import NoOptionLeft, enumerate_options, rank_capacity

    try:
        options = enumerate_options(spec, topology, cost, load_factors, unstated=unstated)
    except NoOptionLeft as e:  # named with what the other tables' checks find: one error for all
        more = _other_tables_problems(e.tables, spec, topology, cost, load_factors, unstated)
        raise InputError("Some tables cannot be placed on this topology" if more else e.title,
                         [*e.problems, *more]) from None
    hbm_cap, ddr_cap = rank_capacity(spec, topology)
    return _checked_space(options, spec, topology, cost, load_factors, hbm_cap, ddr_cap, unstated)


def _other_tables_problems(without: np.ndarray, spec: Spec, topology: Topology, cost: CostConfig,
                           load_factors: np.ndarray | None, unstated: np.ndarray | None) -> list[Problem]:
    """What ``build_search_space``'s checks find of the tables but ``without`` (a table that fits no
    rank, no memory left for tables)."""
    keep = np.setdiff1d(np.arange(len(spec.tables)), without)
    if not len(keep):
        return []
    rest = replace(spec, tables=tuple(spec.tables[i] for i in keep))
    try:
        build_search_space(rest, topology, cost, None if load_factors is None else load_factors[keep],
                           unstated=None if unstated is None else unstated[keep])
    except InputError as e:
        return list(e.problems)
    return []


def _checked_space(options: Options, spec: Spec, topology: Topology, cost: CostConfig,
                   load_factors: np.ndarray | None, hbm_cap: np.ndarray, ddr_cap: np.ndarray,
                   unstated: np.ndarray | None = None) -> SearchSpace:
    """The space of ``options`` on the ranks' capacity, with the cache sizes a plan chose and the
    caches it gives no size; InputError where no memory is left for tables or a table fits no rank."""
    space = build_space(options, len(spec.tables), topology.world_size, topology.local_world_size, hbm_cap, ddr_cap)
    if load_factors is not None and not np.isnan(load_factors).all():
        space = replace(space, chosen_load_factor=np.asarray(load_factors, dtype=np.float64))
    if unstated is not None:
        space = replace(space, unstated=np.asarray(unstated, dtype=bool))
    check_capacity_left(space, topology)
    check_every_table_fits(space, spec, topology, cost)
    return space


def recosted_space(space: SearchSpace, spec: Spec, topology: Topology, cost: CostConfig,
                   load_factors: np.ndarray, tables: np.ndarray, unstated: np.ndarray | None = None) -> SearchSpace:
    """``build_search_space(spec, topology, cost, load_factors, unstated=unstated)`` where
    ``load_factors`` differ from those ``space`` was built with only for ``tables``: only their options
    are costed again (and those of caches whose fetches become priced or unpriced). A cache size changes
    an option's costs, never its shards, so the other tables' options are kept as they are."""
    from rec.cost import enumerate_options

    opts = space.options
    factors = np.asarray(load_factors, dtype=np.float64)
    # A cache at TorchRec's default size goes unstated, its fetches unpriced, unless a cache of another
    # size may share its kernel group (rec.cost.tables.implicit_caches): where a size changes, so may that.
    before = unstated_of(space, spec, cost)
    after = _unstated_before_placing(spec, cost, factors) if unstated is None else np.asarray(unstated, dtype=bool)
    tables = np.union1d(np.asarray(tables, dtype=np.int64), np.flatnonzero(before != after)).astype(np.int64)
    sub = enumerate_options(Spec(tuple(spec.tables[int(t)] for t in tables), spec.spec_hash), topology, cost,
                            factors[tables], unstated=after[tables])
    # Each option of the changed tables, found in ``space`` by (table, sharding type, kernel).
    o, found = opts.find(tables[sub.table], sub.sharding_type, sub.compute_kernel)
    if not found.all():
        raise ValueError("a cache size changed a table's options")
    if not np.array_equal(opts.shard_start[o + 1] - opts.shard_start[o], np.diff(sub.shard_start)):
        raise ValueError("a cache size changed an option's shards")
    mine, theirs = opts.entries(o), sub.entries(np.arange(sub.num_options))
    for field in ("rows", "cols", "repeat"):
        if not np.array_equal(getattr(opts, field)[mine], getattr(sub, field)[theirs]):
            raise ValueError("a cache size changed an option's shards")
    perf, hbm, ddr = opts.perf.copy(), opts.hbm.copy(), opts.ddr.copy()
    perf[mine], hbm[mine], ddr[mine] = sub.perf[theirs], sub.hbm[theirs], sub.ddr[theirs]
    options = replace(opts, perf=perf, hbm=hbm, ddr=ddr)
    return _checked_space(options, spec, topology, cost, factors, space.hbm_cap, space.ddr_cap, unstated)


def unstated_of(space: SearchSpace, spec: Spec, cost: CostConfig) -> np.ndarray:
    """(T,) the caches ``space`` costs as given no size: as a plan's placement decided them, else as
    before tables are placed (``rec.cost.tables.implicit_caches``)."""
    if space.unstated is not None:
        return space.unstated
    return _unstated_before_placing(spec, cost, space.chosen_load_factor)


def _unstated_before_placing(spec: Spec, cost: CostConfig, load_factors: np.ndarray | None) -> np.ndarray:
    from rec.cost.tables import implicit_caches, resolved_load_factors

    return implicit_caches(spec, load_factors, resolved_load_factors(spec, cost, load_factors), cost)


def search_result(space: SearchSpace, config: SearchConfig = SearchConfig(), mapper: Mapper | None = None,
                  groups: int = 1, start: Assignment | None = None, wall_s: float | None = None) -> SearchResult:
    """Search every table of ``space``: a first plan (``groups`` > 1: from that many table groups
    searched apart, then merged), then the exact stage. From ``start`` (a plan of ``space``), the
    exact stage alone. ``mapper`` runs the tasks (default: in this process, one after the other).
    ``wall_s`` stops the exact stage sooner than ``config.time_limit_s``, which still sizes its
    budgets (what is left of a limit that several searches share); ``stats["exact_s"]`` is the
    time it took."""
    mapper = mapper or InProcess(space)
    bound, ladder = prepare(space, config)
    if start is None:
        progress.update(f"heuristic: {len(ladder.limits)} shard limits, bound {bound.value:.4g} ms")
        a = _first_plan(space, config, bound, ladder, mapper, groups)
    else:
        a = start.copy()
    progress.update(f"exact stage: best {a.critical_path:.4g} ms, bound {bound.value:.4g} ms")
    # One after the other, the tasks share the time limit and stop once one proves the plan
    # optimal; side by side, each has all of it and the outcomes after that proof are not taken.
    began = time.perf_counter()
    cap = config.time_limit_s if wall_s is None else min(wall_s, config.time_limit_s)
    tasks = within(exact_tasks(space, a, bound, config), cap)
    a, bound, stats = combine(a, bound, mapper.map(partial(run_task, incumbent=a, bound=bound), tasks))
    return SearchResult(space, a, bound, stats={**stats, "exact_s": time.perf_counter() - began})


def _first_plan(space: SearchSpace, config: SearchConfig, bound: LowerBound, ladder: Ladder, mapper: Mapper,
                groups: int) -> Assignment:
    if groups == 1:  # nothing to merge: the heuristic (and its rescue) over all tables, as one task
        [a] = mapper.map(partial(first_plan, config=config, bound=bound), [ladder])
        return a
    results = list(mapper.map(partial(search_group, ladder=ladder), split_groups(space, groups)))
    try:
        return merge_groups(space, results, bound, config)
    except PackingError as e:
        return rescued(space, config, bound, e)


def search(space: SearchSpace, config: SearchConfig = SearchConfig()) -> Assignment:
    """The assignment ``search_result`` finds."""
    return search_result(space, config).assignment
