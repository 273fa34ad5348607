"""Which rows each rank reads, in what order, epoch after epoch; and where the ranks are in it.

An epoch orders the dataset's row groups (shuffled with the epoch's seed, or in path order) and
reads their rows one after the other: global positions ``0 .. N-1``. Rank ``r`` of ``W`` gets
the ``L = N // W`` positions ``[r L, (r+1) L)``: shares of equal length, so that every rank starts
each epoch at the same iteration; the last ``N mod W`` positions (fewer than the ranks, the tail
of that epoch's order) are left out of that epoch. Within its share a rank reads windows of
``window`` consecutive positions, each window's rows in a seeded random order (the bounded shuffle
buffer); without shuffling, windows keep their order.

The ranks' position is one ``Position`` (every rank reads a batch per iteration, so they read the
same number of rows): the epoch and the rows each rank has read of it, which a checkpoint saves. A
training resumed on another number of ranks re-splits what is left of the epoch: each old rank's
unread rows, in the order it would have read them, old ranks one after the other, cut into equal
contiguous parts for the new ranks (again fewer than the new ranks' count of rows left out); the
next epoch is split for the new ranks from the start. ``Position.splits`` records the splits of
the current epoch, so that a resume in the middle of a re-split epoch finds the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

POSITION_FORMAT = "shardflow.data_position/v2"  # v2 adds the files' ``stamp``
POSITION_FORMATS = ("shardflow.data_position/v1", POSITION_FORMAT)  # what a resume reads
POSITION_FILE = "data_position.json"  # in each checkpoint's step directory


@dataclass(frozen=True)
class Position:
    """Where every rank is in the data: it has read ``rows`` rows of its share of the current split
    of ``epoch``; the split is over ``world_size`` ranks, after the earlier ``splits`` of this epoch
    (each: the ranks of that split, and the rows each had read when it ended)."""

    world_size: int
    epoch: int = 0
    rows: int = 0
    splits: tuple[tuple[int, int], ...] = ()

    def on(self, world_size: int) -> Position:
        """This position for a training on ``world_size`` ranks: a re-split when it differs."""
        if world_size == self.world_size:
            return self
        if self.rows == 0 and not self.splits:
            return replace(self, world_size=world_size)
        return Position(world_size, self.epoch, 0, (*self.splits, (self.world_size, self.rows)))


@dataclass(frozen=True)
class Piece:
    """Reading positions ``[start, stop)`` of base rank ``rank``'s order of the epoch: the order the
    epoch's first split gives that rank (windows shuffled)."""

    rank: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ReadOrder:
    """The order of a dataset's rows: row group sizes (in path order), the seed, the window."""

    group_rows: np.ndarray  # int64, one per row group
    seed: int
    shuffle: bool
    window: int

    @property
    def total(self) -> int:
        return int(self.group_rows.sum())

    def group_order(self, epoch: int) -> np.ndarray:
        """The row groups of ``epoch`` in reading order."""
        n = len(self.group_rows)
        if not self.shuffle:
            return np.arange(n)
        order: np.ndarray = np.random.default_rng([self.seed, epoch]).permutation(n)
        return order

    def share_rows(self, position: Position) -> int:
        """Rows each rank reads in ``position``'s split of its epoch."""
        return self._shares(position)[-1]

    def _shares(self, position: Position) -> list[int]:
        """Rows each rank reads in every split of ``position``'s epoch, its current split last."""
        worlds = [*(w for w, _ in position.splits), position.world_size]
        shares = [self.total // worlds[0]]
        for (world, done), after in zip(position.splits, worlds[1:], strict=True):
            shares.append(world * (shares[-1] - done) // after)
        return shares

    def epoch_read(self, position: Position) -> float:
        """The share of ``position``'s epoch the ranks have read, over its splits (0 to 1)."""
        first = position.splits[0][0] if position.splits else position.world_size
        readable = first * (self.total // first)
        read = sum(world * done for world, done in position.splits) + position.world_size * position.rows
        return read / readable if readable else 0.0

    def position_problem(self, position: Position) -> str | None:
        """Why ``position`` is no place in this order (a split or the rows read beyond a share of
        the epoch: an edited position file); None where it is one."""
        shares = self._shares(position)
        for (world, done), share in zip(position.splits, shares, strict=False):  # the current split: last
            if done > share:
                return f"a split of {world} ranks read {done:,} rows each, beyond their share of {share:,}"
        if position.rows > shares[-1]:
            return (f"{position.rows:,} rows read on each of {position.world_size} ranks, beyond their share "
                    f"of {shares[-1]:,}")
        return None

    def advance(self, position: Position, rows: int) -> Position:
        """``position`` after every rank has read ``rows`` more rows (into later epochs as needed)."""
        left = self.share_rows(position) - position.rows
        if rows < left:
            return replace(position, rows=position.rows + rows)
        rows -= left
        epoch_rows = self.total // position.world_size
        if epoch_rows == 0:
            raise ValueError(f"{self.total} rows give {position.world_size} ranks no row each")
        epochs, rows = divmod(rows, epoch_rows)
        return Position(position.world_size, position.epoch + 1 + epochs, rows)

    def pieces(self, position: Position, rank: int) -> list[Piece]:
        """What rank ``rank`` reads of ``position``'s split, from the start of the split, in order."""
        worlds = [*(w for w, _ in position.splits), position.world_size]
        length = self.total // worlds[0]
        shares = [[Piece(r, 0, length)] for r in range(worlds[0])]
        for (_, done), after in zip(position.splits, worlds[1:], strict=True):
            left = [p for share in shares for p in skip(share, done)]
            each = sum(map(len, left)) // after
            shares = [_take(left, k * each, each) for k in range(after)]
        return shares[rank]

    def window_positions(self, epoch: int, base_world: int, rank: int, window: int) -> tuple[int, np.ndarray]:
        """Window ``window`` of base rank ``rank``'s share in ``epoch``: its first global position,
        and the offsets from it in reading order."""
        length = self.total // base_world
        start = window * self.window
        size = min(self.window, length - start)
        if size <= 0:
            raise ValueError(f"window {window} is past the share of {length} rows")
        offsets = (np.random.default_rng([self.seed, epoch, base_world, rank, window]).permutation(size)
                   if self.shuffle else np.arange(size))
        return rank * length + start, offsets


def skip(share: list[Piece], rows: int) -> list[Piece]:
    """``share`` without its first ``rows`` positions."""
    out = []
    for p in share:
        if rows >= len(p):
            rows -= len(p)
            continue
        out.append(Piece(p.rank, p.start + rows, p.stop))
        rows = 0
    return out


def _take(pieces: list[Piece], start: int, rows: int) -> list[Piece]:
    """Positions ``[start, start + rows)`` of the concatenation of ``pieces``."""
    out = []
    for p in pieces:
        if start >= len(p):
            start -= len(p)
            continue
        if rows <= 0:
            break
        n = min(rows, len(p) - start)
        out.append(Piece(p.rank, p.start + start, p.start + start + n))
        rows -= n
        start = 0
    return out

