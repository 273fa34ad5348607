"""Replanning from a previous plan: keep every shard where it is unless moving it buys enough.

Given a target critical path (``(1 + max_regress)`` x that of a plan searched from scratch in the
same run), two plans within it are built and the one that moves fewer bytes wins:

* *keep*: every kept or resized table keeps its previous sharding type, kernel and ranks; added
  tables (and tables whose previous option is gone) are placed greedily on top; a rank over its
  memory sheds the shards whose move costs least; then, while the busiest rank is above the
  target, the move off it that costs the fewest moved bytes per millisecond gained is made;
* *pull back*: start from the fresh plan with its ranks relabelled to overlap the previous plan
  most (a permutation of interchangeable ranks changes no load: an assignment problem over the
  bytes each rank would keep), give tables their previous option and ranks back, then single
  shards their previous rank, whenever the target and memory still hold.

If neither reaches the target, the fresh plan is the answer. ``rec.search.least_moved`` then
improves the best of them exactly (a MILP minimising moved bytes within the target). Moved bytes are estimated here per
shard (the data of the previous plan a shard holds, if it leaves the rank that held it);
``rec.plan.movement`` measures the chosen plan exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from rec.config.cost import CostConfig
from rec.cost.tables import optimizer_multipliers
from rec.cost.types import Options
from rec.plan.types import Plan, Replicas, Shard
from rec.search.assignment import Assignment, usage
from rec.search.placement import Placement, movable
from rec.search.refine import refine
from rec.search.space import SearchSpace
from rec.search.switch import Bar, distinct_options, option_changes, place_option, switch_options
from rec.sharding import COMPUTE_KERNELS, SHARDING_TYPES, ST_CODE, ShardingType
from rec.spec.types import Spec
from rec.tolerance import TIME_NOISE

DATA_PARALLEL = ST_CODE[ShardingType.DATA_PARALLEL]
MAX_REGRESS = 0.02  # default: the critical path may be 2% above a plan searched from scratch
MAX_REPAIR_STEPS = 20_000
MAX_RELABEL_RANKS = 4096  # the assignment problem is ranks x ranks
# Ranks whose fixed-position shards cost the same to this many decimals of a millisecond (and hold
# the same bytes) are interchangeable.
SAME_LOAD_DECIMALS = 9


@dataclass(frozen=True)
class Previous:
    """The previous plan in the new search space's terms."""

    option: np.ndarray  # (T,) the option with the previous sharding type and kernel, -1 if none
    first_rank: np.ndarray  # (E,) previous first rank of each entry of those options, -1 if unknown
    present_bytes: np.ndarray  # (E,) previous data within an entry's shards, wherever it is now
    kept_bytes: np.ndarray  # (E,) of that, the data already on the entry's home ranks: what
    # moving it off them moves (less than present when a resized table's row split shifts)
    table_bytes: np.ndarray  # (T,) previous data of each table (one copy)
    replicated: np.ndarray  # (T,) bool: the previous plan held a replica of the table on every rank

    def switch_bytes(self, space: SearchSpace, t: int, o: int) -> float:
        """Estimated previous data that table ``t`` moves with option ``o`` instead of its previous
        one (0 for the previous option: its shards' ranks are counted apart)."""
        if o == self.option[t] or self.replicated[t]:
            return 0.0  # a replicated table is already on every rank, whatever comes next
        copies = space.world_size - 1 if space.options.sharding_type[o] == DATA_PARALLEL else 1
        return copies * float(self.table_bytes[t])

    def moved_in_place(self, entries: np.ndarray | slice, ranks: np.ndarray) -> np.ndarray:
        """Per entry of a table's previous option placed on ``ranks``: the previous data that
        moves (all of it off its home ranks, the shifted rows of a resized split at home)."""
        home = (self.first_rank[entries] >= 0) & (ranks == self.first_rank[entries])
        moved: np.ndarray = self.present_bytes[entries] - np.where(home, self.kept_bytes[entries], 0.0)
        return moved


def previous_placement(space: SearchSpace, spec: Spec, old: Plan, cost: CostConfig) -> Previous:
    opts = space.options
    t_count = space.num_tables
    option = np.full(t_count, -1, np.int64)
    first_rank = np.full(len(opts.perf), -1, np.int64)
    present = np.zeros(len(opts.perf))
    kept = np.zeros(len(opts.perf))
    table_bytes = np.zeros(t_count)
    replicated = np.zeros(t_count, bool)
    old_tables = {t.key: t for t in old.tables}  # tables by name and module
    old_specs = {t.key: t for t in old.spec.tables}
    dims = np.array([t.embedding_dim for t in spec.tables], np.int64)
    per_cell = np.array([t.data_type.bytes_per_element for t in spec.tables], float) * \
        (1.0 + optimizer_multipliers(spec, cost, dims))
    codes = {(s, k): (i, j) for i, s in enumerate(SHARDING_TYPES) for j, k in enumerate(COMPUTE_KERNELS)}
    lws = space.local_world_size
    for t, table in enumerate(spec.tables):
        before, row = old_tables.get(table.key), old_specs.get(table.key)
        if before is None or row is None or row.embedding_dim != table.embedding_dim \
                or row.data_type != table.data_type:
            continue  # added, or re-initialized: nothing of it is on any rank
        rows_before = row.num_embeddings
        table_bytes[t] = rows_before * table.embedding_dim * per_cell[t]
        replicated[t] = isinstance(before.shards, Replicas)
        st, ck = codes[(before.sharding_type, before.compute_kernel)]
        mine = np.flatnonzero((opts.table == t) & (opts.sharding_type == st) & (opts.compute_kernel == ck)
                              & space.feasible)
        if not len(mine):
            continue
        o = int(mine[0])
        option[t] = o
        entries = _entries(space, o)
        present[entries] = _visible_rows(opts, entries, rows_before) * opts.cols[entries] * per_cell[t]
        kind = space.placement[o]
        if kind == Placement.EVERY_RANK:
            first_rank[entries] = space.entry_position[entries]
        elif kind == Placement.HOST_UNIFORM and not isinstance(before.shards, Replicas) and before.shards:
            first_rank[entries] = (before.shards[0].rank // lws) * lws + space.entry_position[entries]
        elif not isinstance(before.shards, Replicas):
            by_column = {s.offsets[1]: s.rank for s in before.shards if s.offsets[0] == 0}
            first_rank[entries] = [by_column.get(int(c), -1) for c in opts.col_offset[entries]]
        kept[entries] = present[entries] if replicated[t] else \
            _cells_at_home(opts, entries, first_rank[entries], before.shards) * per_cell[t]
    return Previous(option, first_rank, present, kept, table_bytes, replicated)


def _visible_rows(opts: Options, entries: np.ndarray, rows_before: int) -> np.ndarray:
    """Per entry, the rows of all its shards (a run of ``repeat``) that existed before."""
    out = np.zeros(len(entries))
    for i, e in enumerate(entries):
        starts = opts.row_offset[e] + opts.row_step[e] * np.arange(opts.repeat[e])
        out[i] = np.clip(np.minimum(opts.rows[e], rows_before - starts), 0, None).sum()
    return out


def _cells_at_home(opts: Options, entries: np.ndarray, home: np.ndarray, old_shards: Sequence[Shard]) -> np.ndarray:
    """Per entry, the cells of its shards that the previous plan held on the same ranks, with the
    entry at ``home`` (its run's shard k on rank home + k)."""
    by_rank: dict[int, list[tuple[int, int, int, int]]] = {}
    for s in old_shards:
        by_rank.setdefault(s.rank, []).append((*s.offsets, *s.sizes))
    out = np.zeros(len(entries))
    for i, (e, h) in enumerate(zip(entries, home, strict=True)):
        if h < 0:
            continue
        for k in range(int(opts.repeat[e])):
            r0 = int(opts.row_offset[e] + k * opts.row_step[e])
            c0, rows, cols = int(opts.col_offset[e]), int(opts.rows[e]), int(opts.cols[e])
            for o_r, o_c, o_rows, o_cols in by_rank.get(int(h) + k, ()):
                dr = min(r0 + rows, o_r + o_rows) - max(r0, o_r)
                dc = min(c0 + cols, o_c + o_cols) - max(c0, o_c)
                out[i] += max(dr, 0) * max(dc, 0)
    return out


def moved_bytes(space: SearchSpace, a: Assignment, prev: Previous) -> float:
    """The previous data ``a`` moves, as ``Previous`` estimates it."""
    return float(moved_per_table(space, a, prev).sum())


def moved_per_table(space: SearchSpace, a: Assignment, prev: Previous) -> np.ndarray:
    """(T,) the previous data ``a`` moves, table by table."""
    out = np.zeros(space.num_tables)
    same = a.choice == prev.option
    for t in np.flatnonzero(~same):
        out[t] = prev.switch_bytes(space, int(t), int(a.choice[t]))
    kept = np.flatnonzero(same)
    if len(kept):
        entries = np.concatenate([_entries(space, int(a.choice[t])) for t in kept])
        counts = space.options.shard_start[a.choice[kept] + 1] - space.options.shard_start[a.choice[kept]]
        out += np.bincount(np.repeat(kept, counts), prev.moved_in_place(entries, a.shard_rank[entries]),
                           space.num_tables)
    return out


def warm_starts(space: SearchSpace, fresh: Assignment, prev: Previous, target: float) -> list[Assignment]:
    """Plans within ``target`` that keep much of the previous plan's data in place (see the
    module), fewest estimated moved bytes first; the caller measures them exactly."""
    kept = _keep(space, fresh, prev, target)
    starts = [kept, _relabel(space, fresh, prev)]
    if kept is not None and kept.critical_path > target * (1 + TIME_NOISE):
        # The repair got stuck: balance from the kept plan with the full local search, then
        # bring back what that moved where the target allows.
        starts.append(_balanced(space, kept))
    found = [_pull_back(space, a, prev, target) for a in starts if a is not None]
    found = [a for a in found if a.critical_path <= target * (1 + TIME_NOISE)]
    return sorted(found, key=lambda a: (moved_bytes(space, a, prev), a.critical_path))


def _entries(space: SearchSpace, o: int) -> np.ndarray:
    return np.arange(space.options.shard_start[o], space.options.shard_start[o + 1])


def _keep(space: SearchSpace, fresh: Assignment, prev: Previous, target: float) -> Assignment | None:
    choice = np.where(prev.option >= 0, prev.option, fresh.choice)
    shard_rank = np.full(len(space.options.perf), -1, np.int32)
    pending = []
    for t, o in enumerate(choice):
        entries = _entries(space, int(o))
        if prev.option[t] == o and (prev.first_rank[entries] >= 0).all():
            shard_rank[entries] = prev.first_rank[entries]
        else:
            pending.append(t)
    a = usage(space, choice, shard_rank)
    for t in sorted(pending, key=lambda t: -space.work[choice[t]]):
        placed = place_option(space, (a.loads, a.hbm, a.ddr), int(choice[t]))
        if placed is None:
            return None
        a.take_option(space, t, int(choice[t]), placed)
    if not _shed_memory(space, a, prev):
        return None
    _repair(space, a, prev, target)
    return a


def _balanced(space: SearchSpace, a: Assignment) -> Assignment:
    a = a.copy()
    refine(space, a)
    while switch_options(space, a):
        refine(space, a)
    return a


def _movable_entries(space: SearchSpace, a: Assignment) -> np.ndarray:
    placed: np.ndarray = np.flatnonzero(a.shard_rank >= 0)
    chosen: np.ndarray = placed[movable(space.placement[space.entry_owner[placed]])]
    return chosen


def _cost(prev: Previous, e: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Change of moved bytes when entries ``e`` go from ``src`` to ``dst``."""
    home = prev.first_rank[e]
    return np.where(src == home, prev.kept_bytes[e], 0.0) - np.where(dst == home, prev.kept_bytes[e], 0.0)


def _shed_memory(space: SearchSpace, a: Assignment, prev: Previous) -> bool:
    """Move shards off ranks over their memory (grown tables kept in place), cheapest first."""
    for _ in range(MAX_REPAIR_STEPS):
        over = np.flatnonzero((a.hbm > space.hbm_cap) | (a.ddr > space.ddr_cap))
        if not len(over):
            return True
        r = int(over[0])
        mine = _movable_entries(space, a)
        mine = mine[a.shard_rank[mine] == r]
        if not len(mine):
            return False
        e = int(mine[np.argmin(_cost(prev, mine, np.full(len(mine), r), np.full(len(mine), -1)))])
        q = _target_rank(space, a, e, r)
        if q is None:
            return False
        a.move(space, e, r, q)
    return False


def _target_rank(space: SearchSpace, a: Assignment, e: int, r: int) -> int | None:
    """The least-loaded rank (of r's host, for host-bound shards) other than r with room for e."""
    opts = space.options
    ranks = np.arange(space.world_size)
    if space.placement[space.entry_owner[e]] == Placement.HOST_FREE:
        lws = space.local_world_size
        ranks = (r // lws) * lws + np.arange(lws)
    room = ((a.hbm[ranks] + opts.hbm[e] <= space.hbm_cap[ranks])
            & (a.ddr[ranks] + opts.ddr[e] <= space.ddr_cap[ranks]) & (ranks != r))
    if not room.any():
        return None
    return int(ranks[np.argmin(np.where(room, a.loads[ranks], np.inf))])


def _repair(space: SearchSpace, a: Assignment, prev: Previous, target: float) -> None:
    """While the busiest rank is above ``target``: the change with the fewest moved bytes per
    millisecond it takes off the busiest rank: a shard moved to the least-loaded rank with room,
    or a table of the busiest rank given another of its options."""
    opts = space.options
    alternatives = distinct_options(space)
    for _ in range(MAX_REPAIR_STEPS):
        r = int(np.argmax(a.loads))
        cp = float(a.loads[r])
        if cp <= target * (1 + TIME_NOISE):
            return
        best: tuple[tuple[float, float], Callable[[], None]] | None = None
        mine = _movable_entries(space, a)
        for e in mine[a.shard_rank[mine] == r]:
            q = _target_rank(space, a, int(e), r)
            if q is None:
                continue
            p = float(opts.perf[e])
            gain = cp - max(cp - p, float(a.loads[q]) + p)
            if gain > TIME_NOISE * cp:
                cost = float(_cost(prev, np.array([e]), np.array([r]), np.array([q]))[0])
                if best is None or (cost / gain, -gain) < best[0]:
                    best = ((cost / gain, -gain), partial(a.move, space, int(e), r, q))
        for t, o, placed in option_changes(space, a, r, alternatives, Bar(cp * (1 + TIME_NOISE))):
            if placed.loads.max() > cp * (1 + TIME_NOISE):
                continue
            gain = cp - float(placed.loads[r])  # several ranks may tie at the top: lower this one
            if gain > TIME_NOISE * cp:
                cost = prev.switch_bytes(space, t, o) - prev.switch_bytes(space, t, int(a.choice[t]))
                if best is None or (cost / gain, -gain) < best[0]:
                    best = ((cost / gain, -gain), partial(a.take_option, space, t, o, placed))
        if best is None:
            return
        best[1]()


def _relabel(space: SearchSpace, a: Assignment, prev: Previous) -> Assignment:
    """``a`` with whole hosts, then freely placed shards of whole ranks, moved onto the
    interchangeable host or rank that held most of their data before (``_relabel_hosts``,
    ``_relabel_ranks``)."""
    return _relabel_ranks(space, _relabel_hosts(space, a, prev), prev)


def _relabel_hosts(space: SearchSpace, a: Assignment, prev: Previous) -> Assignment:
    """Hosts renumbered (every shard keeping its local rank) so that each sits where most of its
    host-bound and freely placed data was. The shards placed on every rank stay: they cost the same
    on every host, and a renumbering that changes any load or overflows memory is not taken."""
    hosts, lws = space.num_hosts, space.local_world_size
    if hosts < 2 or hosts > MAX_RELABEL_RANKS:
        return a
    opts = space.options
    placed = np.flatnonzero(a.shard_rank >= 0)
    owner = space.entry_owner[placed]
    moving = placed[space.placement[owner] != Placement.EVERY_RANK]
    home = prev.first_rank[moving]
    known = (home >= 0) & (prev.option[opts.table[space.entry_owner[moving]]] == space.entry_owner[moving])
    weight = np.zeros((hosts, hosts))
    src = a.shard_rank[moving].astype(np.int64)
    np.add.at(weight, (src[known] // lws, home[known] // lws), prev.kept_bytes[moving][known])
    to = _relabelling(-weight)
    if to is None:
        return a
    shard_rank = a.shard_rank.copy()
    shard_rank[moving] = to[src // lws] * lws + src % lws
    b = usage(space, a.choice, shard_rank)
    same_loads = np.allclose(np.sort(b.loads), np.sort(a.loads), rtol=TIME_NOISE, atol=0.0)
    fits = (b.hbm <= space.hbm_cap).all() and (b.ddr <= space.ddr_cap).all()
    return b if same_loads and fits and b.critical_path <= a.critical_path * (1 + TIME_NOISE) else a


def _relabel_ranks(space: SearchSpace, a: Assignment, prev: Previous) -> Assignment:
    """``a`` with its freely placed shards moved as whole ranks onto the interchangeable rank
    that held most of them before. Ranks are interchangeable when their fixed-position shards
    (replicas, row-wise slices) cost and hold the same; with host-bound shards in the plan, only
    within a host."""
    world = space.world_size
    free = _movable_entries(space, a)
    if not len(free) or world > MAX_RELABEL_RANKS:
        return a
    opts = space.options
    fixed = usage(space, a.choice, np.where(np.isin(np.arange(len(a.shard_rank)), free), -1, a.shard_rank))
    profile = np.stack([np.round(fixed.loads, SAME_LOAD_DECIMALS), fixed.hbm, fixed.ddr], axis=1)
    same = (profile[:, None, :] == profile[None, :, :]).all(axis=2)
    if (space.placement[space.entry_owner[free]] == Placement.HOST_FREE).any():
        host = np.arange(world) // space.local_world_size
        same &= host[:, None] == host[None, :]
    src = a.shard_rank[free].astype(np.int64)
    home = prev.first_rank[free]
    owner = space.entry_owner[free]
    known = (home >= 0) & (prev.option[opts.table[owner]] == owner)
    weight = np.zeros((world, world))
    np.add.at(weight, (src[known], home[known]), prev.kept_bytes[free][known])
    to = _relabelling(np.where(same, -weight, np.inf))
    if to is None:
        return a
    shard_rank = a.shard_rank.copy()
    shard_rank[free] = to[src]
    return usage(space, a.choice, shard_rank)


def _relabelling(cost: np.ndarray) -> np.ndarray | None:
    """The new label of each old one (hosts or ranks) at least total ``cost[old, new]``; None
    when every label stays."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(cost)
    to = np.empty(len(cost), np.int64)
    to[rows] = cols
    return None if (to == np.arange(len(cost))).all() else to


def _pull_back(space: SearchSpace, fresh: Assignment, prev: Previous, target: float) -> Assignment:
    """The fresh plan with tables, then shards, put back where they were while ``target`` holds."""
    a = fresh.copy()
    limit = target * (1 + TIME_NOISE)
    for t in np.argsort(-prev.table_bytes, kind="stable"):
        o = int(prev.option[t])
        if o < 0 or a.choice[t] == o:
            continue
        entries = _entries(space, o)
        if (prev.first_rank[entries] < 0).any():
            continue
        old = _entries(space, int(a.choice[t]))
        trial_rank = a.shard_rank.copy()
        trial_rank[old] = -1
        trial_rank[entries] = prev.first_rank[entries]
        choice = a.choice.copy()
        choice[t] = o
        trial = usage(space, choice, trial_rank)
        if trial.critical_path <= limit and (trial.hbm <= space.hbm_cap).all() and (trial.ddr <= space.ddr_cap).all():
            a = trial
    opts = space.options
    away = _movable_entries(space, a)
    away = away[space.placement[space.entry_owner[away]] == Placement.FREE]  # host-bound shards move with their table
    home = prev.first_rank[away]
    same = prev.option[opts.table[space.entry_owner[away]]] == space.entry_owner[away]
    away = away[same & (home >= 0) & (a.shard_rank[away] != home)]
    for e in away[np.argsort(-prev.kept_bytes[away], kind="stable")]:
        src, dst = int(a.shard_rank[e]), int(prev.first_rank[e])
        if (a.loads[dst] + opts.perf[e] <= limit and a.hbm[dst] + opts.hbm[e] <= space.hbm_cap[dst]
                and a.ddr[dst] + opts.ddr[e] <= space.ddr_cap[dst]):
            a.move(space, int(e), src, dst)
    return a
