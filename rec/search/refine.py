"""Local search: move or swap single shards off the most loaded rank while that lowers it."""

from __future__ import annotations

import numpy as np

from rec.search.assignment import Assignment, chosen_shards
from rec.search.placement import Placement, movable
from rec.search.space import SearchSpace
from rec.tolerance import lowers

MOVE_TARGET_RANKS = 64  # moves try this many least-loaded ranks first
SWAP_PARTNER_RANKS = 8  # swaps look at shards on this many least-loaded ranks
SWAP_PAIR_BUDGET = 10_000  # compare all pairs of two ranks' shards up to this many pairs
SWAP_WINDOW = 16  # otherwise: this many nearest candidates per shard


def refine(space: SearchSpace, a: Assignment, max_rounds: int = 100_000) -> None:
    """Improve ``a`` in place; each accepted step lowers the busiest rank without creating a
    rank as busy, so the critical path never grows and the loop terminates."""
    opts = space.options
    shards = chosen_shards(space, a.choice)
    owner_placement = space.placement[np.repeat(a.choice, opts.shard_start[a.choice + 1]
                                                - opts.shard_start[a.choice])]
    free = movable(owner_placement)
    shards, host_bound = shards[free], owner_placement[free] == Placement.HOST_FREE
    if not len(shards):
        return
    perf, hbm, ddr = opts.perf[shards], opts.hbm[shards], opts.ddr[shards]
    members = _Members(a.shard_rank[shards].astype(np.int64), space.world_size)
    lws = space.local_world_size
    for _ in range(max_rounds):
        r = int(np.argmax(a.loads))
        cp = a.loads[r]
        on_r = members.on(r)
        if not len(on_r):
            break
        # Moves are cheap to find; swaps only when no move helps.
        best = _best_move(space, a, r, on_r, perf, hbm, ddr, host_bound, lws)
        if best is None or not lowers(best[0], cp):
            best = _best_swap(space, a, r, on_r, members, perf, hbm, ddr, host_bound)
        if best is None or not lowers(best[0], cp):
            break
        _, i, q, j = best
        a.move(space, int(shards[i]), r, q)
        members.move(i, r, q)
        if j >= 0:
            a.move(space, int(shards[j]), q, r)
            members.move(j, q, r)


class _Members:
    """The shards on each rank, kept up to date as shards move (no scan of all shards)."""

    def __init__(self, rank: np.ndarray, world_size: int):
        order = np.argsort(rank, kind="stable")
        bounds = np.searchsorted(rank[order], np.arange(world_size + 1))
        self.lists = [order[bounds[q]:bounds[q + 1]].tolist() for q in range(world_size)]

    def on(self, q: int) -> np.ndarray:
        return np.sort(np.array(self.lists[q], dtype=np.int64))

    def move(self, i: int, src: int, dst: int) -> None:
        self.lists[src].remove(i)
        self.lists[dst].append(i)


Step = tuple[float, int, int, int]  # (new pair peak, shard, target rank, swapped shard or -1)


def _best_move(space: SearchSpace, a: Assignment, r: int, on_r: np.ndarray, perf: np.ndarray, hbm: np.ndarray,
               ddr: np.ndarray, host_bound: np.ndarray, lws: int) -> Step | None:
    """(new pair peak, shard, target rank, -1) of the best single-shard move, or None.

    A shard's best target is the least-loaded rank with room for it, so only the
    ``MOVE_TARGET_RANKS`` least-loaded ranks are tried, and all ranks for the shards that fit none
    of them: the same peaks as trying every rank."""
    targets = _least_loaded(a.loads, MOVE_TARGET_RANKS)
    peak, target = _best_targets(space, a, r, on_r, targets, perf, hbm, ddr, host_bound, lws)
    stuck = ~np.isfinite(peak)
    if stuck.any() and len(targets) < space.world_size:
        peak[stuck], target[stuck] = _best_targets(space, a, r, on_r[stuck], np.arange(space.world_size),
                                                   perf, hbm, ddr, host_bound, lws)
    i = int(np.argmin(peak))
    if not np.isfinite(peak[i]):
        return None
    return float(peak[i]), int(on_r[i]), int(target[i]), -1


def _best_targets(space: SearchSpace, a: Assignment, r: int, on_r: np.ndarray, targets: np.ndarray,
                  perf: np.ndarray, hbm: np.ndarray, ddr: np.ndarray, host_bound: np.ndarray,
                  lws: int) -> tuple[np.ndarray, np.ndarray]:
    """Per shard of ``on_r``: the pair peak of its best move among ``targets``, and that target."""
    peak = _move_peaks(space, a, r, on_r, targets, perf, hbm, ddr, host_bound, lws)
    column = np.argmin(peak, axis=1)
    return peak[np.arange(len(on_r)), column], targets[column]


def _move_peaks(space: SearchSpace, a: Assignment, r: int, on_r: np.ndarray, targets: np.ndarray,
                perf: np.ndarray, hbm: np.ndarray, ddr: np.ndarray, host_bound: np.ndarray, lws: int) -> np.ndarray:
    """Pair peak of moving each shard of ``on_r`` to each target (inf where it does not fit)."""
    p = perf[on_r][:, None]
    fits = ((a.hbm[targets][None, :] + hbm[on_r][:, None] <= space.hbm_cap[targets][None, :])
            & (a.ddr[targets][None, :] + ddr[on_r][:, None] <= space.ddr_cap[targets][None, :]))
    fits &= (targets != r)[None, :]
    if host_bound[on_r].any():
        same_host = (targets[None, :] // lws) == r // lws
        fits &= ~host_bound[on_r][:, None] | same_host
    peak = np.maximum(a.loads[r] - p, a.loads[targets][None, :] + p)
    return np.where(fits, peak, np.inf)


def _least_loaded(loads: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` least-loaded ranks, least first (ties: lower rank first)."""
    if count >= len(loads):
        return np.argsort(loads, kind="stable")
    part = np.argpartition(loads, count)[:count + 1]
    order = part[np.lexsort((part, loads[part]))]
    return order[:count]


def _best_swap(space: SearchSpace, a: Assignment, r: int, on_r: np.ndarray, members: _Members, perf: np.ndarray,
               hbm: np.ndarray, ddr: np.ndarray, host_bound: np.ndarray) -> Step | None:
    """Best exchange of a shard on ``r`` with a smaller one on a lightly loaded rank.

    For partner rank q with slack g = load[r] - load[q], swapping sizes p_i > p_j lowers the pair's
    peak most when p_i - p_j is near g / 2. Small ranks compare all pairs; on big ones each shard
    of r looks only at the ``SWAP_WINDOW`` shards of q nearest p_i - g / 2 (binary search)."""
    free_r = on_r[~host_bound[on_r]]
    if not len(free_r):
        return None
    cp = a.loads[r]
    best = None
    p_r = perf[free_r]
    for q in _least_loaded(a.loads, SWAP_PARTNER_RANKS + 1):
        q = int(q)
        slack = cp - a.loads[q]
        on_q = members.on(q) if q != r else on_r[:0]
        on_q = on_q[~host_bound[on_q]]
        if slack <= 0 or not len(on_q):
            continue
        order = on_q[np.argsort(perf[on_q], kind="stable")]
        if len(free_r) * len(order) <= SWAP_PAIR_BUDGET:
            j = np.broadcast_to(order, (len(free_r), len(order)))
        else:
            at = np.searchsorted(perf[order], p_r - slack / 2)
            window = np.arange(-SWAP_WINDOW // 2, SWAP_WINDOW // 2)
            j = order[np.clip(at[:, None] + window, 0, len(order) - 1)]
        d = p_r[:, None] - perf[j]
        dh = hbm[free_r][:, None] - hbm[j]
        dd = ddr[free_r][:, None] - ddr[j]
        ok = ((d > 0) & (a.hbm[r] - dh <= space.hbm_cap[r]) & (a.hbm[q] + dh <= space.hbm_cap[q])
              & (a.ddr[r] - dd <= space.ddr_cap[r]) & (a.ddr[q] + dd <= space.ddr_cap[q]))
        if not ok.any():
            continue
        peak = np.where(ok, np.maximum(cp - d, a.loads[q] + d), np.inf)
        k = int(np.argmin(peak))
        i, col = divmod(k, j.shape[1])
        if best is None or peak[i, col] < best[0]:
            best = (float(peak[i, col]), int(free_r[i]), q, int(j[i, col]))
    return best
