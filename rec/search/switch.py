"""Local search over options: give a table a different sharding option when that lowers the
critical path.

Packing picks options by least total work, which is right when there are many tables to even
out; with few tables the granularity matters more (8 table-wise shards pair up evenly on 4 ranks
while a data-parallel replica loads every rank). Each step takes one table touching the busiest
rank, re-places it with each of its other options greedily on top of everything else, and keeps
the best change if it lowers the busiest rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rec.search.assignment import Assignment, Placed
from rec.search.placement import Placement
from rec.search.space import SearchSpace, add_runs
from rec.tolerance import lowers

CANDIDATE_TABLES = 48  # tables (most load on the busiest rank first) tried per step
# Plain ints: place_option runs up to a million times a plan, and enum attribute lookups add up.
_EVERY_RANK, _HOST_UNIFORM = int(Placement.EVERY_RANK), int(Placement.HOST_UNIFORM)
_HOST_FREE = int(Placement.HOST_FREE)
SKIP_MARGIN = 1e-9  # an option is skipped only where its bound exceeds the bar by more than rounding


class DistinctOptions:
    """Per table, its feasible options minus those another option beats on time, largest shard and
    memory within the same placement (e.g. fused_uvm next to fused), worked out when first asked
    for: a local search asks about the few tables on its busiest ranks, not all of them."""

    def __init__(self, space: SearchSpace):
        opts = space.options
        self.space = space
        self.total_hbm = opts.total(opts.hbm)
        self.total_ddr = opts.total(opts.ddr)
        self.starts = np.searchsorted(opts.table, np.arange(space.num_tables + 1))
        self._kept: dict[int, np.ndarray] = {}
        self.shapes = Shapes(space)  # what place_option places them with

    def get(self, t: int, default: np.ndarray | tuple[()] = ()) -> np.ndarray | tuple[()]:
        """Table ``t``'s distinct options; ``default`` where it has no feasible one."""
        if t not in self._kept:
            self._kept[t] = self._distinct(t)
        kept = self._kept[t]
        return kept if len(kept) else default

    def _distinct(self, t: int) -> np.ndarray:
        space = self.space
        mine = np.arange(self.starts[t], self.starts[t + 1])
        mine = mine[space.feasible[mine]]
        keys = np.stack([space.work[mine], space.max_shard[mine], self.total_hbm[mine].astype(float),
                         self.total_ddr[mine].astype(float)])
        # beats[p, o]: p is no worse than o on every measure, in the same placement, and strictly
        # better on one (or, tied on all, the lower index): p dominates o.
        no_worse = (keys[:, :, None] <= keys[:, None, :]).all(axis=0)
        better = (keys[:, :, None] < keys[:, None, :]).any(axis=0) | (mine[:, None] < mine[None, :])
        same = space.placement[mine][:, None] == space.placement[mine][None, :]
        beats = no_worse & better & same
        kept: np.ndarray = mine[~beats.any(axis=0)].astype(np.int64)
        return kept


def distinct_options(space: SearchSpace) -> DistinctOptions:
    """Per table (``.get(t, default)``), its options that no other option of it dominates."""
    return DistinctOptions(space)


def switch_options(space: SearchSpace, a: Assignment, max_steps: int = 200) -> bool:
    """Improve ``a`` in place by changing options; True if anything changed."""
    alternatives = distinct_options(space)
    changed = False
    for _ in range(max_steps):
        r = int(np.argmax(a.loads))
        cp = a.loads[r]
        best: tuple[float, int, int, Placed] | None = None
        bar = Bar(float(cp))  # a change must lower the busiest rank and beat the best one so far
        for t, o, placed in option_changes(space, a, r, alternatives, bar):
            peak = float(placed.loads.max())
            if best is None or peak < best[0]:
                best = (peak, t, o, placed)
                bar.value = min(bar.value, peak)
        if best is None or not lowers(best[0], cp):
            break
        _, t, o, placed = best
        a.take_option(space, t, o, placed)
        changed = True
    return changed


@dataclass
class Bar:
    """The busiest rank an option change must stay at or under; the caller may lower it while
    changes come."""

    value: float = math.inf


def option_changes(space: SearchSpace, a: Assignment, rank: int, alternatives: DistinctOptions,
                   bar: Bar | None = None) -> Iterator[tuple[int, int, Placed]]:
    """(table, option, placement) for each other option (of ``alternatives``) of the tables with
    most load on ``rank`` that fits, placed greedily on top of the other tables. An option whose
    busiest rank must exceed ``bar`` is skipped without placing it."""
    bar = bar or Bar()
    for t in tables_on(space, a, rank)[:CANDIDATE_TABLES]:
        base = without(space, a, int(t))
        loads = base[0]
        floor, least, total = float(loads.max()), float(loads.min()), float(loads.sum())
        for o in alternatives.get(int(t), ()):
            if o == a.choice[t]:
                continue
            # The busiest rank after placing o is at least the other tables' busiest, the least
            # loaded plus o's largest shard, and the mean.
            peak_at_least = max(floor, least + float(space.max_shard[o]),
                                (total + float(space.work[o])) / space.world_size)
            if peak_at_least > bar.value * (1 + SKIP_MARGIN):
                continue
            placed = place_option(space, base, int(o), alternatives.shapes)
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


@dataclass(frozen=True)
class Shape:
    """What an option adds to the ranks wherever it is placed: an EVERY_RANK option's usage on
    every rank; a HOST_UNIFORM option's on the ranks of the host it takes (the same on each host),
    and the sum's rounding that the ranks after that host get (``add_runs`` adds and subtracts each
    run), so that a placement adds exactly what ``_usage`` gives for it."""

    loads: np.ndarray
    hbm: np.ndarray
    ddr: np.ndarray
    after: float = 0.0


class Shapes:
    """Each option's ``Shape``, worked out when first placed: a local search places the same few
    options again at every step."""

    def __init__(self, space: SearchSpace):
        self.space = space
        self._shapes: dict[int, Shape] = {}

    def get(self, o: int) -> Shape:
        if o not in self._shapes:
            self._shapes[o] = _shape(self.space, o)
        return self._shapes[o]


def _shape(space: SearchSpace, o: int) -> Shape:
    entries = np.arange(space.options.shard_start[o], space.options.shard_start[o + 1])
    p, h, d = _usage(space, entries, space.entry_position[entries].astype(np.int64))
    if int(space.placement[o]) == _EVERY_RANK:
        return Shape(p, h, d)
    lws = space.local_world_size
    return Shape(p[:lws], h[:lws], d[:lws], float(p[lws]) if lws < space.world_size else 0.0)


def place_option(space: SearchSpace, base: Usage, o: int, shapes: Shapes | None = None) -> Placed | None:
    """Greedy placement of option ``o`` on top of ``base``; None if it does not fit. ``shapes``:
    the options' shapes worked out so far (a local search's), else worked out here."""
    kind = int(space.placement[o])
    if kind == _EVERY_RANK or kind == _HOST_UNIFORM:
        return _place_fixed(space, base, o, kind, (shapes or Shapes(space)).get(o))
    loads, hbm, ddr = (x.copy() for x in base)
    opts = space.options
    entries = np.arange(opts.shard_start[o], opts.shard_start[o + 1])
    lws = space.local_world_size
    on = slice(0, space.world_size)  # the ranks the shards may take: all, or the least loaded host's
    if kind == _HOST_FREE:
        host = int(np.argmin(loads.reshape(space.num_hosts, lws).sum(axis=1)))
        on = slice(host * lws, (host + 1) * lws)
    first = np.empty(len(entries), dtype=np.int64)
    order = np.argsort(-opts.perf[entries], kind="stable") if len(entries) > 1 else (0,)
    for i in order:
        e = entries[i]
        room = ((hbm[on] + opts.hbm[e] <= space.hbm_cap[on]) & (ddr[on] + opts.ddr[e] <= space.ddr_cap[on]))
        if not room.any():
            return None
        r = on.start + int(np.argmin(np.where(room, loads[on], np.inf)))
        first[i] = r
        loads[r] += opts.perf[e]
        hbm[r] += opts.hbm[e]
        ddr[r] += opts.ddr[e]
    return Placed(loads, hbm, ddr, first)


def _place_fixed(space: SearchSpace, base: Usage, o: int, kind: int, shape: Shape) -> Placed | None:
    """An EVERY_RANK option (``kind``) on every rank; a HOST_UNIFORM one on the host with the lowest peak."""
    loads, hbm, ddr = base
    position = space.entry_position[space.options.shard_start[o]:space.options.shard_start[o + 1]]
    if kind == _EVERY_RANK:
        loads, hbm, ddr = loads + shape.loads, hbm + shape.hbm, ddr + shape.ddr
        first = position.astype(np.int64)
    else:
        host = _least_peak_host(space, loads, hbm, ddr, shape)
        if host is None:
            return None
        lws = space.local_world_size
        ranks = slice(host * lws, (host + 1) * lws)
        loads, hbm, ddr = loads.copy(), hbm.copy(), ddr.copy()
        loads[ranks] += shape.loads
        hbm[ranks] += shape.hbm
        ddr[ranks] += shape.ddr
        if shape.after:
            loads[ranks.stop:] += shape.after
        first = host * lws + position
    if (hbm > space.hbm_cap).any() or (ddr > space.ddr_cap).any():
        return None
    return Placed(loads, hbm, ddr, first)


def _least_peak_host(space: SearchSpace, loads: np.ndarray, hbm: np.ndarray, ddr: np.ndarray,
                     shape: Shape) -> int | None:
    """The host whose ranks take the option's shards (``shape``, the same on every host) with the
    lowest busiest rank overall, the first of equals; None where no host has room."""
    lws, hosts = space.local_world_size, space.num_hosts
    p, h, d = shape.loads, shape.hbm, shape.ddr
    grid = (hosts, lws)
    room = ((hbm.reshape(grid) + h <= space.hbm_cap.reshape(grid))
            & (ddr.reshape(grid) + d <= space.ddr_cap.reshape(grid))).all(axis=1)
    if not room.any():
        return None
    base = loads.reshape(grid)
    own = (base + p).max(axis=1)
    others = base.max(axis=1)
    top = int(np.argmax(others))
    rest = np.delete(others, top)
    elsewhere = np.full(hosts, others[top])
    elsewhere[top] = rest.max() if len(rest) else -np.inf
    return int(np.argmin(np.where(room, np.maximum(own, elsewhere), np.inf)))
