"""A (partial) solution: the chosen option of each table and the rank of each chosen shard."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rec.search.space import SearchSpace, add_runs


@dataclass
class Assignment:
    """Mutable working state of the search; ``loads``/``hbm``/``ddr`` are kept in sync."""

    choice: np.ndarray  # (T,) option index per table
    shard_rank: np.ndarray  # (E,) first rank of each entry of a chosen option, -1 otherwise
    loads: np.ndarray  # (W,) sum of perf per rank
    hbm: np.ndarray  # (W,) bytes used per rank
    ddr: np.ndarray  # (W,)

    @property
    def critical_path(self) -> float:
        return float(self.loads.max()) if len(self.loads) else 0.0

    def copy(self) -> Assignment:
        return Assignment(self.choice.copy(), self.shard_rank.copy(), self.loads.copy(),
                          self.hbm.copy(), self.ddr.copy())


def empty_assignment(space: SearchSpace, choice: np.ndarray) -> Assignment:
    w = space.world_size
    return Assignment(choice.astype(np.int64), np.full(len(space.options.perf), -1, np.int32),
                      np.zeros(w), np.zeros(w, np.int64), np.zeros(w, np.int64))


def chosen_shards(space: SearchSpace, choice: np.ndarray) -> np.ndarray:
    """Indices of all entries of the chosen options, in option order."""
    starts = space.options.shard_start[choice]
    counts = space.options.shard_start[choice + 1] - starts
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    return np.asarray(np.arange(counts.sum()) + offsets)


def usage(space: SearchSpace, choice: np.ndarray, shard_rank: np.ndarray) -> Assignment:
    """The assignment of ``choice`` with its shards on ``shard_rank``, loads and memory summed."""
    placed = np.flatnonzero(shard_rank >= 0)
    first = shard_rank[placed].astype(np.int64)
    rep = space.options.repeat[placed].astype(np.int64)
    opts = space.options
    loads = add_runs(space, opts.perf[placed], first, rep)
    hbm = np.rint(add_runs(space, opts.hbm[placed].astype(float), first, rep)).astype(np.int64)
    ddr = np.rint(add_runs(space, opts.ddr[placed].astype(float), first, rep)).astype(np.int64)
    return Assignment(choice.astype(np.int64), shard_rank.astype(np.int32), loads, hbm, ddr)
