"""A (partial) solution: the chosen option of each table and the rank of each chosen shard.

One convention for change: the local-search steps (``refine``, ``switch_options``, ``polish`` and
the methods below) change the assignment they are given and return nothing (or whether they
changed anything); every other function that returns an assignment (``pack``, ``usage``,
``decode``, ``search`` ...) builds a new one and leaves its inputs as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from rec.search.space import SearchSpace, add_runs


class Placed(NamedTuple):
    """One option placed on top of the other tables (``rec.search.switch.place_option``): the
    ranks' loads and memory with it, and the first rank of each of its entries."""

    loads: np.ndarray
    hbm: np.ndarray
    ddr: np.ndarray
    first: np.ndarray


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

    def move(self, space: SearchSpace, entry: int, src: int, dst: int) -> None:
        """Move a freely placed shard (``entry``) from rank ``src`` to rank ``dst``."""
        opts = space.options
        self.loads[src] -= opts.perf[entry]
        self.loads[dst] += opts.perf[entry]
        self.hbm[src] -= opts.hbm[entry]
        self.hbm[dst] += opts.hbm[entry]
        self.ddr[src] -= opts.ddr[entry]
        self.ddr[dst] += opts.ddr[entry]
        self.shard_rank[entry] = dst

    def take_option(self, space: SearchSpace, table: int, option: int, placed: Placed) -> None:
        """Give ``table`` ``option``, placed as ``placed`` says (its totals already count the change)."""
        opts = space.options
        self.shard_rank[opts.shards(int(self.choice[table]))] = -1
        self.shard_rank[opts.shards(option)] = placed.first
        self.choice[table] = option
        self.loads, self.hbm, self.ddr = placed.loads, placed.hbm, placed.ddr


def empty_assignment(space: SearchSpace, choice: np.ndarray) -> Assignment:
    w = space.world_size
    return Assignment(choice.astype(np.int64), np.full(len(space.options.perf), -1, np.int32),
                      np.zeros(w), np.zeros(w, np.int64), np.zeros(w, np.int64))


def chosen_shards(space: SearchSpace, choice: np.ndarray) -> np.ndarray:
    """Indices of all entries of the chosen options, in option order."""
    return space.options.entries(choice)


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
