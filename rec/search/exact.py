"""The exact stage: improve the heuristic plan and its bound with HiGHS, under a budget.

Two strategies, independent of each other given the heuristic plan (so Ray actors can race them
and the driver keeps the best; in this process they run one after the other, and a plan proven
optimal by the first skips the second):

* ``full``: the whole MILP (``rec.search.milp``), warm-started from the plan, when it is small
  enough. Its dual bound is a proven lower bound; closing the gap proves the plan optimal.
* ``neighbourhoods``: large-neighbourhood search. Each step frees the tables on the busiest
  ranks and a few lightly loaded partners, holds every other table in place and solves that
  small MILP exactly (options and ranks of the freed tables both change); improvements are kept.

Budgets are deterministic: HiGHS runs on one thread with a fixed seed and stops at a node limit,
and the neighbourhood search takes a fixed number of steps; both are sized from
``SearchConfig.time_limit_s`` at a conservative rate for a 2-core machine. The time limit itself
is only a wall-clock safety cap: if a loaded or slow machine reaches it first, the plan depends
on where HiGHS was stopped, and so on machine load. Plans are reproducible whenever the cap is
not reached (``info["exact_capped"]`` says whether it was).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np

from rec.config.search import SearchConfig
from rec.search.assignment import Assignment, usage
from rec.search.bound import BoundMethod, LowerBound
from rec.search.milp import (
    MIP_REL_GAP,
    MilpLimits,
    MilpOutcome,
    build_model,
    decode,
    distinct,
    solve,
    start_vector,
)
from rec.search.placement import Placement
from rec.search.refine import refine
from rec.search.space import SearchSpace
from rec.tolerance import SOLVER_TOLERANCE, TIME_NOISE

# Skip the stage when the heuristic is already this close to the bound, unless its whole model is
# this small (integer columns), given at most this long.
SKIP_GAP = 0.01
SMALL_MODEL_COLUMNS = 150
SMALL_MODEL_S = 1.0
# The whole MILP only up to this many integer columns (estimated before building it) per second
# of time limit: HiGHS's root node (cuts, sub-MIP heuristics), which no node limit stops, takes
# about ``ROOT_S_PER_COLUMN`` on a 2-core machine. Its node budget is the time left after the
# root at ``FULL_COLUMNS_PER_NODE_S / columns`` nodes per second (measured on 300-2,500 columns:
# 40-80 nodes/s at 2,500).
FULL_COLUMNS_PER_S = 150
ROOT_S_PER_COLUMN = 0.003
FULL_COLUMNS_PER_NODE_S = 100_000
# Neighbourhoods: tables freed per step, partner ranks (cycled), HiGHS nodes per step, consecutive
# steps without improvement before stopping, and the budget: simplex iterations per second of
# time limit, half what a 2-core machine does (about 10,000/s on these models).
NEIGHBOURHOOD_TABLES = 12
NEIGHBOURHOOD_PARTNERS = (1, 3, 7)
NEIGHBOURHOOD_NODES = 200
NEIGHBOURHOOD_PATIENCE = 15
ITERATIONS_PER_S = 5_000
# With both strategies, each gets this share of the time limit's budget, so that run one after
# the other (locally) they stay within the limit.
FULL_SHARE = 0.8
# A plan within this (relative) of its bound counts as proven optimal: HiGHS stops within
# MIP_REL_GAP of its bound, and the bound it reports is shaved by as much again.
OPTIMALITY_TOLERANCE = 3 * MIP_REL_GAP
# The rescue's time scale when no shard takes any time (ms): anything above zero.
MIN_TIME_SCALE = 1e-12


class Strategy(StrEnum):
    FULL = "full"
    NEIGHBOURHOODS = "neighbourhoods"


@dataclass(frozen=True)
class ExactTask:
    """One strategy with its deterministic budget and wall-clock cap."""

    strategy: Strategy
    budget: int  # FULL: HiGHS nodes; NEIGHBOURHOODS: simplex iterations
    seconds: float


@dataclass(frozen=True)
class ExactOutcome:
    assignment: Assignment | None  # better than the incumbent, or None
    dual_bound: float = 0.0  # a proven lower bound (ms), 0 if none
    capped: bool = False  # stopped by the wall clock: the result may depend on machine load
    info: dict[str, Any] = field(default_factory=dict)


def exact_tasks(space: SearchSpace, incumbent: Assignment, bound: LowerBound,
                config: SearchConfig) -> list[ExactTask]:
    """What to run for this plan: nothing when the gap is small or no time is allowed."""
    t = config.time_limit_s
    cp = incumbent.critical_path
    if t <= 0 or bound.value <= 0:
        return []
    if cp <= (1 + SKIP_GAP) * bound.value:
        # Close to the bound: only a model small enough to solve in moments is worth it (another
        # planner's plan may sit in that last percent).
        columns = full_model_columns(space, cp, SMALL_MODEL_COLUMNS)
        if columns > SMALL_MODEL_COLUMNS:
            return []
        t = min(t, SMALL_MODEL_S)
        return [ExactTask(Strategy.FULL, _full_nodes(t, columns), t)]
    columns = full_model_columns(space, cp, FULL_COLUMNS_PER_S * t)
    if columns > FULL_COLUMNS_PER_S * t:
        return [ExactTask(Strategy.NEIGHBOURHOODS, max(1, int(ITERATIONS_PER_S * t)), t)]
    return [ExactTask(Strategy.FULL, _full_nodes(t, columns), t),
            ExactTask(Strategy.NEIGHBOURHOODS, max(1, int(ITERATIONS_PER_S * (1 - FULL_SHARE) * t)), t)]


def last_look_tasks(space: SearchSpace, incumbent: Assignment, bound: LowerBound,
                    config: SearchConfig) -> list[ExactTask]:
    """A last look at a finished plan within ``SKIP_GAP`` of its bound that the exact stage left as
    it was (its whole model over ``SMALL_MODEL_COLUMNS``): neighbourhoods of its busiest ranks for at
    most ``SMALL_MODEL_S``, since another planner's plan may sit in that last percent. Taken on the
    plan the passes finished, so that the plans before it stay what they were."""
    t = min(config.time_limit_s, SMALL_MODEL_S)
    cp = incumbent.critical_path
    if t <= 0 or bound.value <= 0 or not (1 + OPTIMALITY_TOLERANCE) * bound.value < cp <= (1 + SKIP_GAP) * bound.value:
        return []
    if full_model_columns(space, cp, SMALL_MODEL_COLUMNS) <= SMALL_MODEL_COLUMNS:
        return []  # the exact stage's own look solved the whole model
    return [ExactTask(Strategy.NEIGHBOURHOODS, max(1, int(ITERATIONS_PER_S * t)), t)]


def _full_nodes(seconds: float, columns: float) -> int:
    """The whole MILP's node budget: its share of ``seconds`` after the root node."""
    nodes = (FULL_SHARE * seconds - ROOT_S_PER_COLUMN * columns) * FULL_COLUMNS_PER_NODE_S / max(columns, 1)
    return max(1, int(nodes))


def within(tasks: list[ExactTask], seconds: float) -> Iterator[ExactTask]:
    """``tasks``, each capped at what is left of ``seconds`` when it is taken: run one after the
    other as they are taken, they all stay within the cap; taken at once (to run side by side),
    each gets all of it."""
    deadline = time.perf_counter() + seconds
    for task in tasks:
        yield replace(task, seconds=min(task.seconds, max(deadline - time.perf_counter(), 0.0)))


def run_task(space: SearchSpace, task: ExactTask, incumbent: Assignment, bound: LowerBound) -> ExactOutcome:
    """Run one task from the incumbent (a pure function of its inputs until the cap)."""
    if task.seconds <= 0:
        return ExactOutcome(None, capped=True)
    if task.strategy is Strategy.FULL:
        return _full(space, incumbent, bound, task)
    return _neighbourhoods(space, incumbent, bound, task)


def combine(incumbent: Assignment, bound: LowerBound,
            outcomes: Iterable[ExactOutcome]) -> tuple[Assignment, LowerBound, dict[str, Any]]:
    """The best assignment (first on ties) and the best bound, never above the plan. Once the
    plan is proven optimal no further outcome is taken: from a lazy iterable (tasks run as they
    are taken) those tasks do not run at all."""
    best, info = incumbent, {"exact_capped": False}
    remaining = iter(outcomes)
    while best.critical_path > bound.value * (1 + OPTIMALITY_TOLERANCE):
        o = next(remaining, None)
        if o is None:
            break
        if o.assignment is not None and o.assignment.critical_path < best.critical_path:
            best = o.assignment
        bound = bound.improved(min(o.dual_bound, best.critical_path), BoundMethod.MILP)
        info["exact_capped"] |= o.capped
        info.update(o.info)
    return best, bound, info


def rescue(space: SearchSpace, bound: LowerBound, config: SearchConfig) -> Assignment | None:
    """A first plan from the whole MILP when no candidate selection packs (memory too tight for
    the greedy packing); None when the model is too large for the time limit or has no solution."""
    t = config.time_limit_s
    columns = full_model_columns(space, np.inf, FULL_COLUMNS_PER_S * t)
    if t <= 0 or columns > FULL_COLUMNS_PER_S * t:
        return None
    options = model_options(space, np.inf)
    scale = bound.value if bound.value > 0 else max(float(space.max_shard[options].max()), MIN_TIME_SCALE)
    model = build_model(space, options, scale, (bound.value, np.inf))
    nodes = max(1, int(FULL_COLUMNS_PER_NODE_S * t / max(columns, 1)))
    out = solve(model, MilpLimits(nodes, t))
    if out.values is None:
        return None
    empty = usage(space, np.zeros(space.num_tables, np.int64), np.full(len(space.options.perf), -1, np.int32))
    return decode(model, space, out.values, empty)


def full_model_columns(space: SearchSpace, critical_path: float, limit: float) -> float:
    """Integer columns of the whole MILP for plans below ``critical_path``; inf when the options
    before deduplication already show it is far over ``limit`` (so that large specs skip the
    per-option deduplication: duplicates, e.g. one-block column_wise, at most triple the count)."""
    ok = np.flatnonzero(space.feasible & (space.max_shard <= critical_path))
    if integer_columns(space, ok) > 4 * limit:
        return np.inf
    return integer_columns(space, distinct(space, ok))


def model_options(space: SearchSpace, critical_path: float, tables: np.ndarray | None = None) -> np.ndarray:
    """Options a better plan may use: feasible, largest shard below the critical path, distinct."""
    ok = space.feasible & (space.max_shard <= critical_path)
    if tables is not None:
        ok &= np.isin(space.options.table, tables)
    return distinct(space, np.flatnonzero(ok))


def integer_columns(space: SearchSpace, options: np.ndarray, ranks: int | None = None) -> int:
    """Integer columns of the MILP over ``options`` (x, host choices and shard counts)."""
    ranks = space.world_size if ranks is None else ranks
    kind = space.placement[options]
    free = (kind == Placement.FREE) | (kind == Placement.HOST_FREE)
    entries = space.options.num_entries()[options]
    hosts = space.num_hosts if space.num_hosts > 1 else 0
    bound_to_host = (kind == Placement.HOST_UNIFORM) | (kind == Placement.HOST_FREE)
    return int(len(options) + entries[free].sum() * ranks + bound_to_host.sum() * hosts)


def _full(space: SearchSpace, incumbent: Assignment, bound: LowerBound, task: ExactTask) -> ExactOutcome:
    cp = incumbent.critical_path
    model = build_model(space, model_options(space, cp), cp, (bound.value, cp))
    out = solve(model, MilpLimits(task.budget, task.seconds), start_vector(model, space, incumbent))
    found = decode(model, space, out.values, incumbent) if out.values is not None else None
    better = found if found is not None and found.critical_path < cp else None
    return ExactOutcome(better, out.dual_bound, out.capped,
                        {"milp_status": out.status, "milp_nodes": out.nodes, "milp_s": round(out.seconds, 3)})


def _neighbourhoods(space: SearchSpace, incumbent: Assignment, bound: LowerBound, task: ExactTask) -> ExactOutcome:
    deadline = time.perf_counter() + task.seconds
    a = incumbent.copy()
    stale, step, spent, capped = 0, 0, 0, False
    # The rank sets solved since the incumbent last changed: on few ranks the steps' partners run
    # out and a step would solve the same MILP from the same start again, to the same end.
    tried: set[tuple[int, ...]] = set()
    while spent < task.budget and stale < NEIGHBOURHOOD_PATIENCE:
        if a.critical_path <= (1 + OPTIMALITY_TOLERANCE) * bound.value:
            break
        left = deadline - time.perf_counter()
        if left <= 0:
            capped = True
            break
        ranks = _neighbourhood_ranks(a, step)
        step += 1
        if not ranks or ranks in tried:
            stale += 1
            continue
        tried.add(ranks)
        found, out = _neighbourhood_step(space, a, np.array(ranks, dtype=np.int64), left)
        if out is None:
            stale += 1
            continue
        spent += out.iterations
        capped |= out.capped
        if found is not None and found.critical_path < a.critical_path * (1 - TIME_NOISE):
            refine(space, found)
            a, stale, tried = found, 0, set()
        else:
            stale += 1
    better = a if a.critical_path < incumbent.critical_path else None
    return ExactOutcome(better, 0.0, capped, {"neighbourhood_steps": step, "neighbourhood_iterations": spent})


def _neighbourhood_ranks(a: Assignment, step: int) -> tuple[int, ...]:
    """The busiest ranks and ``step``'s partners among the others, sorted; none if there are no others."""
    cp = a.critical_path
    busiest = np.flatnonzero(a.loads >= cp * (1 - SOLVER_TOLERANCE))
    partners_n = NEIGHBOURHOOD_PARTNERS[step % len(NEIGHBOURHOOD_PARTNERS)]
    order = np.argsort(a.loads, kind="stable")
    order = order[~np.isin(order, busiest)]
    if not len(order):
        return ()
    offset = (step // len(NEIGHBOURHOOD_PARTNERS)) * partners_n % len(order)
    partners = np.roll(order, -offset)[:partners_n]
    return tuple(np.sort(np.concatenate((busiest, partners))).tolist())


def _neighbourhood_step(space: SearchSpace, a: Assignment, ranks: np.ndarray,
                        seconds: float) -> tuple[Assignment | None, MilpOutcome | None]:
    """Free the tables on ``ranks``; solve that MILP."""
    cp = a.critical_path
    tables = tables_within(space, a, ranks)
    if not len(tables):
        return None, None
    model = build_model(space, model_options(space, cp, tables), cp, (0.0, cp), without_tables(space, a, tables), ranks)
    out = solve(model, MilpLimits(NEIGHBOURHOOD_NODES, seconds), start_vector(model, space, a))
    found = decode(model, space, out.values, a) if out.values is not None else None
    return found, out


def tables_within(space: SearchSpace, a: Assignment, ranks: np.ndarray) -> np.ndarray:
    """Up to ``NEIGHBOURHOOD_TABLES`` tables whose movable shards all lie on ``ranks`` and that
    load them, most load there first."""
    opts = space.options
    entries = np.flatnonzero(a.shard_rank >= 0)
    owner = space.entry_owner[entries]
    table = opts.table[owner]
    first = a.shard_rank[entries].astype(np.int64)
    rep = opts.repeat[entries].astype(np.int64)
    kind = space.placement[owner]
    movable = (kind == Placement.FREE) | (kind == Placement.HOST_FREE)
    inside = np.isin(first, ranks)
    outside_movable = np.zeros(space.num_tables, bool)
    outside_movable[table[movable & ~inside]] = True
    # Load each table puts on the chosen ranks (runs may cover several of them).
    mask = np.zeros(space.world_size + 1)
    mask[ranks] = 1
    covered = np.cumsum(np.concatenate(([0.0], mask)))
    hits = covered[np.minimum(first + rep, space.world_size)] - covered[first]
    load = np.bincount(table, weights=opts.perf[entries] * hits, minlength=space.num_tables)
    tables = np.flatnonzero((load > 0) & ~outside_movable)
    tables = tables[np.lexsort((tables, -load[tables]))]
    return np.sort(tables[:NEIGHBOURHOOD_TABLES])


def without_tables(space: SearchSpace, a: Assignment, tables: np.ndarray) -> Assignment:
    """``a`` with ``tables`` taken out (their shards unplaced)."""
    shard_rank = a.shard_rank.copy()
    for o in a.choice[tables]:
        shard_rank[space.options.shards(int(o))] = -1
    return usage(space, a.choice, shard_rank)
