"""Greedy placement of the chosen options (longest-processing-time first, memory-aware)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from enum import StrEnum

import numpy as np

from rec.search.assignment import Assignment, chosen_shards, empty_assignment
from rec.search.placement import Placement
from rec.search.space import SearchSpace, add_runs, run_ranks


class PackOrder(StrEnum):
    PERF = "perf"  # balance time: biggest shard first onto the least-loaded rank
    HBM = "hbm"  # when memory is tight: biggest shard in bytes first


class PackingError(Exception):
    """The chosen options cannot be placed within the ranks' memory."""

    def __init__(self, tables: list[int]):
        self.tables = tables
        super().__init__(f"{len(tables)} tables could not be placed")


def pack(space: SearchSpace, choice: np.ndarray, order: PackOrder = PackOrder.PERF,
         start: Assignment | None = None) -> Assignment:
    """Place every shard of the chosen options on top of ``start`` (load already on the ranks,
    left as it is); a new assignment."""
    a = empty_assignment(space, choice) if start is None else start.copy()
    a.choice = choice.astype(np.int64)
    placement = space.placement[choice]
    tables = np.arange(len(choice))
    every_rank = tables[placement == Placement.EVERY_RANK]
    _place_every_rank(space, a, choice[every_rank])
    failed: list[int] = _overflowing(space, a, choice, every_rank)
    uniform = tables[placement == Placement.HOST_UNIFORM]
    uniform = uniform[np.argsort(-space.work[choice[uniform]], kind="stable")]
    failed += _place_host_uniform(space, a, choice[uniform], uniform)
    host_free = tables[placement == Placement.HOST_FREE]
    for t in host_free[np.argsort(-space.work[choice[host_free]], kind="stable")]:
        if not _place_host_free(space, a, int(choice[t])):
            failed.append(int(t))
    failed += _place_free(space, a, choice[placement == Placement.FREE], order)
    if failed:
        raise PackingError(sorted(failed))
    return a


def _place_every_rank(space: SearchSpace, a: Assignment, options: np.ndarray) -> None:
    if not len(options):
        return
    entries = chosen_shards(space, options)
    _assign(space, a, entries, space.entry_position[entries])


def _overflowing(space: SearchSpace, a: Assignment, choice: np.ndarray, tables: np.ndarray) -> list[int]:
    """Where the fixed-position options alone overflow a rank: the fewest of them, biggest per
    rank first, whose removal would make room."""
    over = np.maximum(np.max(a.hbm - space.hbm_cap, initial=0) / max(float(space.hbm_cap.min()), 1.0),
                      np.max(a.ddr - space.ddr_cap, initial=0) / max(float(space.ddr_cap.min()), 1.0))
    if over <= 0:
        return []
    opts = space.options
    size = np.maximum(opts.largest(opts.hbm)[choice[tables]] / max(float(space.hbm_cap.min()), 1.0),
                      opts.largest(opts.ddr)[choice[tables]] / max(float(space.ddr_cap.min()), 1.0))
    order = np.argsort(-size, kind="stable")
    enough = int(np.searchsorted(np.cumsum(size[order]), over)) + 1
    return [int(t) for t in tables[order[:enough]]]


def _assign(space: SearchSpace, a: Assignment, entries: np.ndarray, first_rank: np.ndarray) -> None:
    """Put each entry's run of shards on ranks first_rank.. and account for their cost."""
    opts = space.options
    first = np.asarray(first_rank, dtype=np.int64)
    rep = opts.repeat[entries].astype(np.int64)
    a.shard_rank[entries] = first
    a.loads += add_runs(space, opts.perf[entries], first, rep)
    a.hbm += np.rint(add_runs(space, opts.hbm[entries].astype(float), first, rep)).astype(np.int64)
    a.ddr += np.rint(add_runs(space, opts.ddr[entries].astype(float), first, rep)).astype(np.int64)


def _place_host_uniform(space: SearchSpace, a: Assignment, options: np.ndarray,
                        tables: np.ndarray) -> list[int]:
    """table_row_wise, in the given order: each on the host whose ranks end up least loaded,
    among those with room. Returns the tables that fit no host."""
    if not len(options):
        return []
    opts = space.options
    lws = space.local_world_size
    entries = chosen_shards(space, options)
    owner_row = np.repeat(np.arange(len(options)),
                          opts.shard_start[options + 1] - opts.shard_start[options])
    run_entry, local = run_ranks(space, entries, space.entry_position[entries])
    row = np.repeat(owner_row, opts.repeat[entries])
    perf = np.zeros((len(options), lws))
    hbm = np.zeros((len(options), lws), np.int64)
    ddr = np.zeros((len(options), lws), np.int64)
    perf[row, local] = opts.perf[run_entry]
    hbm[row, local] = opts.hbm[run_entry]
    ddr[row, local] = opts.ddr[run_entry]
    placer = _HostPlacer(space, a, perf, hbm, ddr)
    host_of_row = np.array([placer.place(k) for k in range(len(options))], dtype=np.int64)
    placer.flush()
    placed = host_of_row[owner_row] >= 0
    a.shard_rank[entries[placed]] = (host_of_row[owner_row] * lws + space.entry_position[entries])[placed]
    return [int(t) for t in tables[host_of_row < 0]]


class _HostPlacer:
    """Greedy host choice for row-wise tables with scalar bookkeeping per host.

    Row-wise shards of one table cost the same on every rank (rows do not enter TorchRec's
    perf), so for such a table the best host is the one whose busiest rank is least busy, and a
    conservative per-host memory bound (busiest rank + largest shard <= smallest capacity) settles
    most memory checks. Per-rank arrays are updated in bulk; only tables that fail the bound or
    have unequal shards take the exact per-rank path."""

    def __init__(self, space: SearchSpace, a: Assignment, perf: np.ndarray, hbm: np.ndarray, ddr: np.ndarray):
        lws, hosts = space.local_world_size, space.num_hosts
        self.perf, self.hbm, self.ddr = perf, hbm, ddr
        self.loads, self.used_hbm, self.used_ddr = (x.reshape(hosts, lws) for x in (a.loads, a.hbm, a.ddr))
        self.hbm_cap = space.hbm_cap.reshape(hosts, lws)
        self.ddr_cap = space.ddr_cap.reshape(hosts, lws)
        self.cap_hbm = self.hbm_cap.min(axis=1).tolist()
        self.cap_ddr = self.ddr_cap.min(axis=1).tolist()
        self.flat = (perf.max(axis=1) == perf.min(axis=1)).tolist()
        self.cost = perf[:, 0].tolist()
        self.hbm_need, self.ddr_need = hbm.max(axis=1).tolist(), ddr.max(axis=1).tolist()
        self.pending_rows: list[int] = []
        self.pending_hosts: list[int] = []
        self.peak, self.top_hbm, self.top_ddr = [0.0] * hosts, [0] * hosts, [0] * hosts
        # (peak, host, version): the least busy host, the first on ties, in O(log hosts); an entry
        # whose version is not its host's current one is stale and skipped
        self.version = [0] * hosts
        self.heap: list[tuple[float, int, int]] = []
        self._refresh(range(hosts))

    def _refresh(self, hosts: Iterable[int]) -> None:
        """Exact per-host scalars from the per-rank arrays."""
        for h in hosts:
            self.peak[h] = float(self.loads[h].max())
            self.top_hbm[h] = int(self.used_hbm[h].max())
            self.top_ddr[h] = int(self.used_ddr[h].max())
            self._push(h)

    def _push(self, host: int) -> None:
        self.version[host] += 1
        heapq.heappush(self.heap, (self.peak[host], host, self.version[host]))

    def _least_busy(self) -> int:
        while self.heap[0][2] != self.version[self.heap[0][1]]:
            heapq.heappop(self.heap)
        return self.heap[0][1]

    def flush(self) -> None:
        if self.pending_rows:
            rows, where = np.array(self.pending_rows), np.array(self.pending_hosts)
            np.add.at(self.loads, where, self.perf[rows])
            np.add.at(self.used_hbm, where, self.hbm[rows])
            np.add.at(self.used_ddr, where, self.ddr[rows])
            self.pending_rows, self.pending_hosts = [], []

    def place(self, k: int) -> int:
        if self.flat[k]:
            host = self._least_busy()
            if (self.top_hbm[host] + self.hbm_need[k] <= self.cap_hbm[host]
                    and self.top_ddr[host] + self.ddr_need[k] <= self.cap_ddr[host]):
                self.pending_rows.append(k)
                self.pending_hosts.append(host)
                self.peak[host] += self.cost[k]
                self._push(host)
                self.top_hbm[host] += self.hbm_need[k]  # an upper bound, hence safe
                self.top_ddr[host] += self.ddr_need[k]
                return host
        return self._place_exactly(k)

    def _place_exactly(self, k: int) -> int:
        self.flush()
        fits = ((self.used_hbm + self.hbm[k] <= self.hbm_cap)
                & (self.used_ddr + self.ddr[k] <= self.ddr_cap)).all(axis=1)
        if not fits.any():
            return -1
        peak = np.where(fits, (self.loads + self.perf[k]).max(axis=1), np.inf)
        host = int(np.argmin(peak))
        self.loads[host] += self.perf[k]
        self.used_hbm[host] += self.hbm[k]
        self.used_ddr[host] += self.ddr[k]
        self._refresh([host])
        return host


def _place_host_free(space: SearchSpace, a: Assignment, option: int) -> bool:
    """table_column_wise: the least-loaded host that takes all shards, LPT inside it."""
    lws = space.local_world_size
    host_load = a.loads.reshape(space.num_hosts, lws).sum(axis=1)
    opts = space.options
    shards = np.arange(opts.shard_start[option], opts.shard_start[option + 1])
    shards = shards[np.argsort(-opts.perf[shards], kind="stable")]
    for host in np.argsort(host_load, kind="stable"):
        ranks = _lpt(space, a, shards, np.arange(host * lws, (host + 1) * lws))
        if (ranks >= 0).all():
            _assign(space, a, shards, ranks)
            return True
    return False


def _place_free(space: SearchSpace, a: Assignment, options: np.ndarray,
                order: PackOrder) -> list[int]:
    if not len(options):
        return []
    shards = chosen_shards(space, options)
    opts = space.options
    # Shards no rank has room for even now: fail at once instead of after placing the rest.
    hopeless = ((opts.hbm[shards] > (space.hbm_cap - a.hbm).max())
                | (opts.ddr[shards] > (space.ddr_cap - a.ddr).max()))
    if hopeless.any():
        return _tables_of(space, shards[hopeless])
    primary = opts.perf[shards] if order is PackOrder.PERF else opts.hbm[shards]
    secondary = opts.hbm[shards] if order is PackOrder.PERF else opts.perf[shards]
    shards = shards[np.lexsort((shards, -secondary, -primary))]
    ranks = _lpt(space, a, shards, np.arange(space.world_size))
    ok = ranks >= 0
    _assign(space, a, shards[ok], ranks[ok])
    return _tables_of(space, shards[~ok])


def _tables_of(space: SearchSpace, shards: np.ndarray) -> list[int]:
    opts = space.options
    owners = np.searchsorted(opts.shard_start, shards, side="right") - 1
    return sorted(set(opts.table[owners].tolist()))


def _lpt(space: SearchSpace, a: Assignment, shards: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Rank for each shard (in the given order): the least-loaded of ``ranks`` where it fits,
    -1 where none has room. ``a`` is not changed."""
    opts = space.options
    perf, hbm, ddr = opts.perf[shards].tolist(), opts.hbm[shards].tolist(), opts.ddr[shards].tolist()
    hbm_free = (space.hbm_cap - a.hbm).tolist()
    ddr_free = (space.ddr_cap - a.ddr).tolist()
    heap = [(float(a.loads[r]), int(r)) for r in ranks]
    heapq.heapify(heap)
    out = np.full(len(shards), -1, dtype=np.int32)
    for i in range(len(shards)):
        h, d = hbm[i], ddr[i]
        skipped = []
        while heap:
            load, r = heap[0]
            if h <= hbm_free[r] and d <= ddr_free[r]:
                hbm_free[r] -= h
                ddr_free[r] -= d
                out[i] = r
                heapq.heapreplace(heap, (load + perf[i], r))
                break
            skipped.append(heapq.heappop(heap))
        for item in skipped:
            heapq.heappush(heap, item)
    return out
