"""Local search: move or swap single shards off the most loaded rank while that lowers it."""

from __future__ import annotations

import numpy as np

from rec.search.assignment import Assignment, chosen_shards
from rec.search.placement import FREE, HOST_FREE
from rec.search.space import SearchSpace

SWAP_PARTNER_RANKS = 16  # swaps look at shards on this many least-loaded ranks
EPS = 1e-12


def refine(space: SearchSpace, a: Assignment, max_rounds: int = 100_000) -> Assignment:
    """Improve ``a`` in place; each accepted step lowers the busiest rank without creating a
    rank as busy, so the critical path never grows and the loop terminates."""
    opts = space.options
    shards = chosen_shards(space, a.choice)
    owner_placement = space.placement[np.repeat(a.choice, opts.shard_start[a.choice + 1]
                                                - opts.shard_start[a.choice])]
    movable = (owner_placement == FREE) | (owner_placement == HOST_FREE)
    shards, host_bound = shards[movable], owner_placement[movable] == HOST_FREE
    if not len(shards):
        return a
    perf, hbm, ddr = opts.perf[shards], opts.hbm[shards], opts.ddr[shards]
    rank = a.shard_rank[shards].astype(np.int64)
    lws = space.local_world_size
    for _ in range(max_rounds):
        r = int(np.argmax(a.loads))
        cp = a.loads[r]
        on_r = np.flatnonzero(rank == r)
        if not len(on_r):
            break
        move = _best_move(space, a, r, on_r, perf, hbm, ddr, host_bound, lws)
        swap = _best_swap(space, a, r, on_r, rank, perf, hbm, ddr, host_bound)
        best = min((m for m in (move, swap) if m is not None), default=None,
                   key=lambda m: m[0])
        if best is None or best[0] >= cp - EPS * max(cp, 1.0):
            break
        _, i, q, j = best
        _relocate(a, i, r, q, perf, hbm, ddr, rank)
        if j >= 0:
            _relocate(a, j, q, r, perf, hbm, ddr, rank)
    a.shard_rank[shards] = rank
    return a


def _relocate(a, i, src, dst, perf, hbm, ddr, rank) -> None:
    a.loads[src] -= perf[i]
    a.loads[dst] += perf[i]
    a.hbm[src] -= hbm[i]
    a.hbm[dst] += hbm[i]
    a.ddr[src] -= ddr[i]
    a.ddr[dst] += ddr[i]
    rank[i] = dst


def _best_move(space, a, r, on_r, perf, hbm, ddr, host_bound, lws):
    """(new pair peak, shard, target rank, -1) of the best single-shard move, or None."""
    p = perf[on_r][:, None]
    fits = ((a.hbm[None, :] + hbm[on_r][:, None] <= space.hbm_cap[None, :])
            & (a.ddr[None, :] + ddr[on_r][:, None] <= space.ddr_cap[None, :]))
    fits[:, r] = False
    if host_bound[on_r].any():
        same_host = (np.arange(space.world_size)[None, :] // lws) == r // lws
        fits &= ~host_bound[on_r][:, None] | same_host
    peak = np.maximum(a.loads[r] - p, a.loads[None, :] + p)
    peak = np.where(fits, peak, np.inf)
    flat = int(np.argmin(peak))
    i, q = divmod(flat, space.world_size)
    if not np.isfinite(peak[i, q]):
        return None
    return float(peak[i, q]), int(on_r[i]), int(q), -1


def _best_swap(space, a, r, on_r, rank, perf, hbm, ddr, host_bound):
    """Best exchange of a shard on ``r`` with a smaller one on a lightly loaded rank."""
    free_r = on_r[~host_bound[on_r]]
    if not len(free_r):
        return None
    light = np.argsort(a.loads, kind="stable")[:SWAP_PARTNER_RANKS + 1]
    light = light[light != r]
    partners = np.flatnonzero(np.isin(rank, light) & ~host_bound)
    if not len(partners):
        return None
    q = rank[partners]
    d = perf[free_r][:, None] - perf[partners][None, :]
    dh = hbm[free_r][:, None] - hbm[partners][None, :]
    dd = ddr[free_r][:, None] - ddr[partners][None, :]
    fits = ((a.hbm[r] - dh <= space.hbm_cap[r]) & (a.hbm[q][None, :] + dh <= space.hbm_cap[q][None, :])
            & (a.ddr[r] - dd <= space.ddr_cap[r]) & (a.ddr[q][None, :] + dd <= space.ddr_cap[q][None, :])
            & (d > 0))
    peak = np.where(fits, np.maximum(a.loads[r] - d, a.loads[q][None, :] + d), np.inf)
    flat = int(np.argmin(peak))
    i, j = divmod(flat, len(partners))
    if not np.isfinite(peak[i, j]):
        return None
    return float(peak[i, j]), int(free_r[i]), int(q[j]), int(partners[j])
