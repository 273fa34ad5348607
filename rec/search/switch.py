"""Local search over options: give a table a different sharding option when that lowers the
critical path.

Packing picks options by least total work, which is right when there are many tables to even
out; with few tables the granularity matters more (8 table-wise shards pair up evenly on 4 ranks
while a data-parallel replica loads every rank). Each step takes one table touching the busiest
rank, re-places it with each of its other options greedily on top of everything else, and keeps
the best change if it lowers the busiest rank.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from rec.search.assignment import Assignment, Placed
from rec.search.placement import Placement
from rec.search.space import SearchSpace, add_runs
from rec.tolerance import lowers

CANDIDATE_TABLES = 48  # tables (most load on the busiest rank first) tried per step


def distinct_options(space: SearchSpace) -> dict[int, np.ndarray]:
    """Per table, its feasible options minus those another option beats on time, largest
    shard and memory within the same placement (e.g. fused_uvm next to fused)."""
    opts = space.options
    total_hbm = opts.total(opts.hbm)
    total_ddr = opts.total(opts.ddr)
    out: dict[int, list[int]] = {}
    for i in np.flatnonzero(space.feasible):
        out.setdefault(int(opts.table[i]), []).append(int(i))
    keep: dict[int, np.ndarray] = {}
    for t, mine in out.items():
        kept = []
        for o in mine:
            dominated = any(
                p != o and space.placement[p] == space.placement[o]
                and space.work[p] <= space.work[o] and space.max_shard[p] <= space.max_shard[o]
                and total_hbm[p] <= total_hbm[o] and total_ddr[p] <= total_ddr[o]
                and (space.work[p], space.max_shard[p], total_hbm[p], total_ddr[p], p)
                < (space.work[o], space.max_shard[o], total_hbm[o], total_ddr[o], o)
                for p in mine)
            if not dominated:
                kept.append(o)
        keep[t] = np.array(kept, dtype=np.int64)
    return keep


def switch_options(space: SearchSpace, a: Assignment, max_steps: int = 200) -> bool:
    """Improve ``a`` in place by changing options; True if anything changed."""
    alternatives = distinct_options(space)
    changed = False
    for _ in range(max_steps):
        r = int(np.argmax(a.loads))
        cp = a.loads[r]
        best: tuple[float, int, int, Placed] | None = None
        for t, o, placed in option_changes(space, a, r, alternatives):
            peak = float(placed.loads.max())
            if best is None or peak < best[0]:
                best = (peak, t, o, placed)
        if best is None or not lowers(best[0], cp):
            break
        _, t, o, placed = best
        a.take_option(space, t, o, placed)
        changed = True
    return changed


def option_changes(space: SearchSpace, a: Assignment, rank: int,
                   alternatives: dict[int, np.ndarray]) -> Iterator[tuple[int, int, Placed]]:
    """(table, option, placement) for each other option (of ``alternatives``) of the tables with
    most load on ``rank`` that fits, placed greedily on top of the other tables."""
    for t in tables_on(space, a, rank)[:CANDIDATE_TABLES]:
        base = without(space, a, int(t))
        for o in alternatives.get(int(t), ()):
            if o == a.choice[t]:
                continue
            placed = place_option(space, base, int(o))
            if placed is not None:
                yield int(t), int(o), placed


def tables_on(space: SearchSpace, a: Assignment, rank: int) -> np.ndarray:
    """Tables with load on ``rank``, most load first."""
    opts = space.options
    entries = np.flatnonzero(a.shard_rank >= 0)
    first = a.shard_rank[entries].astype(np.int64)
    covers = (first <= rank) & (rank < first + opts.repeat[entries])
    hit = entries[covers]
    owners = opts.table[space.entry_owner[hit]]
    load = np.bincount(owners, weights=opts.perf[hit], minlength=space.num_tables)
    tables = np.flatnonzero(load > 0)
    return tables[np.argsort(-load[tables], kind="stable")]


Usage = tuple[np.ndarray, np.ndarray, np.ndarray]  # loads, HBM, DDR per rank


def _usage(space: SearchSpace, entries: np.ndarray, first: np.ndarray) -> Usage:
    opts = space.options
    rep = opts.repeat[entries].astype(np.int64)
    return (add_runs(space, opts.perf[entries], first, rep),
            np.rint(add_runs(space, opts.hbm[entries].astype(float), first, rep)).astype(np.int64),
            np.rint(add_runs(space, opts.ddr[entries].astype(float), first, rep)).astype(np.int64))


def without(space: SearchSpace, a: Assignment, t: int) -> Usage:
    """Loads and memory with table ``t`` taken out."""
    o = a.choice[t]
    entries = np.arange(space.options.shard_start[o], space.options.shard_start[o + 1])
    perf, hbm, ddr = _usage(space, entries, a.shard_rank[entries].astype(np.int64))
    return a.loads - perf, a.hbm - hbm, a.ddr - ddr


def place_option(space: SearchSpace, base: Usage, o: int) -> Placed | None:
    """Greedy placement of option ``o`` on top of ``base``; None if it does not fit."""
    loads, hbm, ddr = (x.copy() for x in base)
    opts = space.options
    entries = np.arange(opts.shard_start[o], opts.shard_start[o + 1])
    kind = space.placement[o]
    position = space.entry_position[entries]
    lws = space.local_world_size
    if kind == Placement.EVERY_RANK:
        first = position.astype(np.int64)
    elif kind == Placement.HOST_UNIFORM:
        best = None
        for host in range(space.num_hosts):
            trial = host * lws + position
            p, h, d = _usage(space, entries, trial)
            if ((hbm + h <= space.hbm_cap) & (ddr + d <= space.ddr_cap)).all():
                peak = (loads + p).max()
                if best is None or peak < best[0]:
                    best = (peak, trial)
        if best is None:
            return None
        first = best[1]
    else:
        ranks = np.arange(space.world_size)
        if kind == Placement.HOST_FREE:
            host_load = loads.reshape(space.num_hosts, lws).sum(axis=1)
            ranks = int(np.argmin(host_load)) * lws + np.arange(lws)
        first = np.empty(len(entries), dtype=np.int64)
        for i in np.argsort(-opts.perf[entries], kind="stable"):
            e = entries[i]
            room = ((hbm[ranks] + opts.hbm[e] <= space.hbm_cap[ranks])
                    & (ddr[ranks] + opts.ddr[e] <= space.ddr_cap[ranks]))
            if not room.any():
                return None
            r = int(ranks[np.argmin(np.where(room, loads[ranks], np.inf))])
            first[i] = r
            loads[r] += opts.perf[e]
            hbm[r] += opts.hbm[e]
            ddr[r] += opts.ddr[e]
        return Placed(loads, hbm, ddr, first)
    p, h, d = _usage(space, entries, first)
    loads, hbm, ddr = loads + p, hbm + h, ddr + d
    if (hbm > space.hbm_cap).any() or (ddr > space.ddr_cap).any():
        return None
    return Placed(loads, hbm, ddr, first)
