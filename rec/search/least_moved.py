"""Replanning exactly: the plan within a target critical path that moves the fewest bytes, as a MILP.

The plan problem's MILP (``rec.search.milp``) with the critical path capped at the target and
another objective: the previous data moved, as ``rec.search.warm.Previous`` estimates it. A table
that takes another option than its previous one moves its data (``Previous.switch_bytes``: a
cost on the option's column); one that keeps its option moves the data of every shard that
leaves its rank: for each class of identical shards and each rank that held some of them, a
continuous ``kept <= min(count on that rank now, count there before)`` is credited back (a
host-bound option keeps its data when its host stays). A tiny weight on the critical path breaks
ties toward faster plans.

It runs where the whole MILP is small enough for the time limit (as the exact stage's ``full``
strategy does), warm-started from the best heuristic replan, with a deterministic node budget.
"""

from __future__ import annotations

import time

import numpy as np

from rec.search.assignment import Assignment
from rec.search.exact import (
    FULL_COLUMNS_PER_NODE_S,
    FULL_COLUMNS_PER_S,
    integer_columns,
    model_options,
    tables_within,
    without_tables,
)
from rec.search.milp import MilpLimits, MilpModel, build_model, decode, extended, solve, start_vector
from rec.search.space import SearchSpace
from rec.search.warm import Previous, moved_bytes, moved_per_table
from rec.tolerance import SOLVER_TOLERANCE

CRITICAL_PATH_WEIGHT = 1e-4  # per unit of critical path / target, against moved bytes / all bytes
GAP = {"mip_rel_gap": 1e-3, "mip_abs_gap": 1e-5}  # of the moved fraction: stop when this close
# Neighbourhoods, when the whole model is too large: integer columns per step, and steps
# without improvement before stopping.
STEP_COLUMNS = 1500
PATIENCE = 8


def least_moved(space: SearchSpace, prev: Previous, incumbent: Assignment, target: float,
                seconds: float, wall_s: float | None = None) -> Assignment | None:
    """The plan with critical path <= ``target`` that moves least, better than ``incumbent`` (a
    plan within the target); None when HiGHS finds nothing better within ``seconds``. The whole
    MILP where it is small enough, else neighbourhoods: free the table that moves most, the ranks
    it was and is on and the tables within them, and solve that MILP with everything else held.
    ``seconds`` sizes the budgets; ``wall_s`` (where less) stops it sooner."""
    cap = seconds if wall_s is None else min(wall_s, seconds)
    if cap <= 0 or prev.table_bytes.sum() <= 0 or incumbent.critical_path > target:
        return None
    options = _options(space, prev, incumbent, target, None)
    columns = integer_columns(space, options)
    if columns <= FULL_COLUMNS_PER_S * seconds:
        nodes = max(1, int(FULL_COLUMNS_PER_NODE_S * seconds / max(columns, 1)))
        return _solve(space, prev, incumbent, target, options, None, None, MilpLimits(nodes, cap))
    return _neighbourhoods(space, prev, incumbent, target, cap)


def _neighbourhoods(space: SearchSpace, prev: Previous, incumbent: Assignment, target: float,
                    seconds: float) -> Assignment | None:
    deadline = time.perf_counter() + seconds
    a, moved = incumbent, moved_per_table(space, incumbent, prev)
    tried: set[int] = set()
    stale = 0
    while stale < PATIENCE:
        left = deadline - time.perf_counter()
        order = [int(t) for t in np.argsort(-moved, kind="stable") if moved[t] > 0 and int(t) not in tried]
        if left <= 0 or not order:
            break
        t = order[0]
        tried.add(t)
        ranks = _ranks_of(space, a, prev, t)
        tables = np.union1d([t], tables_within(space, a, ranks))
        options = _options(space, prev, a, target, tables)
        while len(tables) > 1 and integer_columns(space, options, len(ranks)) > STEP_COLUMNS:
            tables = tables[tables != max(int(u) for u in tables if u != t)]
            options = _options(space, prev, a, target, tables)
        nodes = max(1, int(FULL_COLUMNS_PER_NODE_S / max(integer_columns(space, options, len(ranks)), 1)))
        found = _solve(space, prev, a, target, options, without_tables(space, a, tables), ranks,
                       MilpLimits(nodes, left))
        if found is not None:
            now = moved_per_table(space, found, prev)
            if now.sum() < moved.sum() * (1 - SOLVER_TOLERANCE):
                a, moved, stale = found, now, 0
                tried.clear()
                continue
        stale += 1
    return a if a is not incumbent else None


def _options(space: SearchSpace, prev: Previous, a: Assignment, target: float,
             tables: np.ndarray | None) -> np.ndarray:
    """The MILP's options for ``tables`` (all if None), grouped by table: those a plan within
    the target may use, plus each table's previous and current option (so both can be expressed)."""
    opts = space.options
    pick = np.arange(space.num_tables) if tables is None else np.asarray(tables, np.int64)
    theirs = np.concatenate((prev.option[pick][prev.option[pick] >= 0], a.choice[pick]))
    theirs = theirs[space.feasible[theirs] & (space.max_shard[theirs] <= target)]
    options = np.union1d(model_options(space, target, tables), theirs)
    return options[np.argsort(opts.table[options], kind="stable")]


def _solve(space: SearchSpace, prev: Previous, a: Assignment, target: float, options: np.ndarray,
           background: Assignment | None, ranks: np.ndarray | None, limits: MilpLimits) -> Assignment | None:
    model = build_model(space, options, target, (0.0, target), background, ranks)
    moving, counted = _with_movement(model, space, prev, float(prev.table_bytes.sum()))
    start = start_vector(model, space, a)
    if start is not None:  # kept: as much as the shard counts allow
        start = np.concatenate((start, np.minimum(moving.col_upper[model.num_cols:], start[counted])))
    out = solve(moving, limits, start, GAP)
    if out.values is None:
        return None
    found = decode(model, space, out.values[:model.num_cols], a)
    if found is None or found.critical_path > target * (1 + SOLVER_TOLERANCE):
        return None
    return found if start is None or moved_bytes(space, found, prev) < moved_bytes(space, a, prev) else None


def _ranks_of(space: SearchSpace, a: Assignment, prev: Previous, t: int) -> np.ndarray:
    """The ranks table ``t``'s movable shards are on and were on, and the two least loaded."""
    now = a.shard_rank[space.options.shards(int(a.choice[t]))]
    was = prev.first_rank[space.options.shards(int(prev.option[t]))] if prev.option[t] >= 0 else now[:0]
    idle = np.argsort(a.loads, kind="stable")[:2]
    ranks = np.concatenate((now[now >= 0], was[was >= 0], idle)).astype(np.int64)
    return np.unique(ranks)


def _with_movement(model: MilpModel, space: SearchSpace, prev: Previous,
                   total: float) -> tuple[MilpModel, np.ndarray]:
    """The model minimising moved bytes / ``total``, and the shard-count column each appended
    ``kept`` column is bounded by."""
    opts = space.options
    cost = np.zeros(model.num_cols)
    cost[0] = CRITICAL_PATH_WEIGHT
    tables = opts.table[model.options]
    for k, o in enumerate(model.options):
        cost[model.x_col[k]] = prev.switch_bytes(space, int(tables[k]), int(o)) / total
    kept_cost: list[float] = []
    kept_upper: list[float] = []
    n_cols: list[int] = []
    is_previous = model.options == prev.option[tables]
    lws = space.local_world_size
    in_classes = np.zeros(len(model.options), bool)
    in_classes[model.class_option] = True
    for j in np.flatnonzero(is_previous & ~in_classes):  # fixed positions, or one per host
        sl = opts.shards(int(model.options[j]))
        home = prev.first_rank[sl]
        cost[model.x_col[j]] += float(prev.present_bytes[sl].sum()) / total
        kept = float(prev.kept_bytes[sl][home >= 0].sum()) / total
        if model.host_col[j] < 0:
            cost[model.x_col[j]] -= kept
        elif (home >= 0).any():
            cost[model.host_col[j] + int(home[home >= 0][0]) // lws] -= kept
    column = np.full(space.world_size, -1, np.int64)
    column[model.free_ranks] = np.arange(len(model.free_ranks))
    for c in np.flatnonzero(is_previous[model.class_option]):
        entries = model.class_entries[c]
        home = prev.first_rank[entries]
        known = (home >= 0) & (column[np.maximum(home, 0)] >= 0)
        cost[model.x_col[model.class_option[c]]] += float(prev.present_bytes[entries].sum()) / total
        for r in np.unique(home[known]):
            at = known & (home == r)
            kept_cost.append(-float(prev.kept_bytes[entries[at]].sum()) / at.sum() / total)
            kept_upper.append(float(at.sum()))
            n_cols.append(int(model.class_col[c] + column[r]))
    m = len(n_cols)
    new_cols = model.num_cols + np.arange(m)
    rows = model.num_rows + np.arange(m)
    links = (np.concatenate((rows, rows)), np.concatenate((new_cols, n_cols)),
             np.concatenate((np.ones(m), -np.ones(m))))
    return extended(model, np.concatenate((cost, kept_cost)), np.zeros(m), np.array(kept_upper),
                    np.full(m, -np.inf), np.zeros(m), links), np.array(n_cols, np.int64)


def movement_floor(space: SearchSpace, prev: Previous) -> float:
    """Bytes any plan moves, as ``Previous`` estimates them (memory and time ignored): per table,
    the least of keeping its previous option with every shard at home (a resized table whose rows
    are split across ranks still moves the rows the new split shifts) and switching options."""
    opts = space.options
    floor = 0.0
    for t in range(space.num_tables):
        mine = np.flatnonzero((opts.table == t) & space.feasible)
        best = min((prev.switch_bytes(space, t, int(o)) for o in mine if o != prev.option[t]), default=np.inf)
        if prev.option[t] >= 0 and space.feasible[prev.option[t]]:
            entries = opts.shards(int(prev.option[t]))
            best = min(best, float(prev.moved_in_place(entries, prev.first_rank[entries]).sum()))
        floor += 0.0 if not np.isfinite(best) else best
    return floor
