"""Training data from Parquet: each rank reads its share of the row groups (``rec.data.order``),
only the columns the model needs, one window at a time, and converts it to ``Columns`` at once.

``threads`` readers read consecutive windows at once (``rec.data.parallel``), the results in order.
Memory per rank is bounded by a few windows (``--shuffle-window`` rows each) and row groups per
reader, whatever the size of the dataset; only the files' footers are read up front.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rec.data.columns import TRAINING, Columns, Locate, Wording, from_arrow_parts
from rec.data.files import DataFiles
from rec.data.ids import IdsPolicy
from rec.data.layout import DataLayout
from rec.data.order import Piece, Position, ReadOrder, skip
from rec.data.parallel import ordered_map
from rec.data.row_groups import RowGroups
from rec.data.source import Extent, Reading, SourceKind

if TYPE_CHECKING:
    import pyarrow as pa

@dataclass
class ParquetSource:
    """A Parquet dataset read in ``order`` for ``layout``'s model."""

    files: DataFiles
    layout: DataLayout
    order: ReadOrder
    policy: IdsPolicy = IdsPolicy.ERROR
    what: str = "--data"
    threads: int = 1  # readers, each a window at a time
    wording: Wording = TRAINING  # how bad values are named
    _groups: RowGroups = field(init=False, repr=False)
    _layouts: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._groups = RowGroups(self.files, self.layout.columns, keep=self.threads + 1)
        # Every window of an epoch needs its order: computed once per epoch (the current and the next).
        self._layouts = functools.lru_cache(maxsize=2)(self._epoch_layout)
        rows = np.array([g.rows for g in self.files.row_groups], np.int64)
        first_in_file = np.zeros(len(rows), np.int64)
        for i in range(1, len(rows)):
            same = self.files.row_groups[i].file == self.files.row_groups[i - 1].file
            first_in_file[i] = first_in_file[i - 1] + rows[i - 1] if same else 0
        self._first_in_file = first_in_file

    @classmethod
    def open(cls, files: DataFiles, layout: DataLayout, *, seed: int = 0, shuffle: bool = True,
             window: int = 1 << 16, policy: IdsPolicy = IdsPolicy.ERROR, what: str = "--data",
             threads: int = 1, wording: Wording = TRAINING) -> ParquetSource:
        """The source of ``files`` for ``layout``; InputError naming every missing column and column
        of the wrong type (``rec.data.schema``)."""
        from rec.data.schema import schema_problems
        from rec.errors import InputError

        problems = schema_problems(files, layout, what)
        if problems:
            raise InputError(f"Cannot read the data {files.source}:", problems)
        order = ReadOrder(np.array([g.rows for g in files.row_groups], np.int64), seed, shuffle, window)
        return cls(files, layout, order, policy, what, max(1, threads), wording)

    @property
    def description(self) -> str:
        files = len(self.files.paths)
        return f"{self.files.source} ({self.order.total:,} rows in {files:,} file{'s' if files > 1 else ''})"

    def advance(self, position: Position, rows: int) -> Position:
        return self.order.advance(position, rows)

    def position_problem(self, position: Position) -> str | None:
        return self.order.position_problem(position)

    def identity(self) -> dict[str, object]:
        return {"seed": self.order.seed, "shuffle": self.order.shuffle, "window": self.order.window,
                "dataset": self.files.fingerprint, "stamp": self.files.stamp}

    def extent(self, end: Position) -> Extent:
        epochs = end.epoch + self.order.epoch_read(end)
        return Extent(self.files.source, self.order.total, len(self.files.paths), round(epochs, 6),
                      self.order.shuffle)

    def chunks(self, position: Position, rank: int) -> Iterator[Columns]:
        """Rank ``rank``'s rows from ``position`` on, epoch after epoch, in chunks of at most a window."""
        return ordered_map(self._window, self._windows(position, rank), self.threads)

    def _windows(self, position: Position, rank: int) -> Iterator[tuple[int, int, Piece, int]]:
        """What ``chunks`` reads, window by window: (epoch, base world size, piece, window)."""
        window = self.order.window
        while True:
            base = position.splits[0][0] if position.splits else position.world_size
            for piece in skip(self.order.pieces(position, rank), position.rows):
                for k in range(piece.start // window, (piece.stop - 1) // window + 1):
                    yield position.epoch, base, piece, k
            position = Position(position.world_size, position.epoch + 1)

    def batches(self, position: Position, rank: int, batch_size: int) -> Iterator[Columns]:
        """Rank ``rank``'s batches of ``batch_size`` rows from ``position`` on, without end (a
        batch may span the end of an epoch)."""
        if self.order.total // position.world_size == 0:
            raise ValueError("no rows per rank")
        return rebatch(self.chunks(position, rank), batch_size)

    def share_bounds(self, rank: int, world_size: int) -> tuple[int, int]:
        """The positions ``[start, stop)`` of rank ``rank``'s share (``share``), from the files' metadata."""
        total = self.order.total
        return rank * total // world_size, (rank + 1) * total // world_size

    def share(self, rank: int, world_size: int) -> Iterator[Columns]:
        """Every row of rank ``rank``'s share of one pass in path order, the shares of the ranks
        differing by at most one row and covering every row (evaluation, prediction)."""
        start, stop = self.share_bounds(rank, world_size)
        step = self.order.window

        def read(a: int) -> Columns:
            return self._converted(self._positions(0, a, min(a + step, stop), unshuffled=True))

        return ordered_map(read, range(start, stop, step), self.threads)

    def _window(self, task: tuple[int, int, Piece, int]) -> Columns:
        """Window ``k`` of ``piece``: the rows of it the piece holds, in reading order, converted."""
        epoch, base_world, piece, k = task
        window = self.order.window
        first, offsets = self.order.window_positions(epoch, base_world, piece.rank, k)
        lo, hi = max(piece.start - k * window, 0), min(piece.stop - k * window, len(offsets))
        if not self.order.shuffle:  # the window's positions in order: the piece's rows of it alone
            return self._converted(self._positions(epoch, first + lo, first + hi))
        # The window converted in file order, then shuffled in numpy (cheaper than Arrow's take of lists).
        return self._converted(self._positions(epoch, first, first + len(offsets))).take(offsets[lo:hi])

    def _converted(self, parts: list[tuple[pa.Table, Locate]]) -> Columns:
        return from_arrow_parts(parts, self.layout, self.policy, self.what, self.wording)

    def _epoch_layout(self, epoch: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The row groups of ``epoch`` in reading order (None: path order), their sizes, and where
        each starts in the epoch's positions."""
        order = np.arange(len(self.order.group_rows)) if epoch is None else self.order.group_order(epoch)
        sizes = self.order.group_rows[order]
        return order, sizes, np.concatenate([[0], np.cumsum(sizes)])

    def _positions(self, epoch: int, start: int, stop: int, unshuffled: bool = False
                   ) -> list[tuple[pa.Table, Locate]]:
        """The rows at positions ``[start, stop)`` of ``epoch``'s order, a slice of a row group
        each, and how to name each slice's rows."""
        order, sizes, starts = self._layouts(None if unshuffled else epoch)
        g = int(np.searchsorted(starts, start, side="right")) - 1
        parts: list[tuple[pa.Table, Locate]] = []
        while g < len(order) and starts[g] < stop:
            group = int(order[g])
            lo, hi = int(max(start - starts[g], 0)), int(min(stop - starts[g], sizes[g]))
            rg = self.files.row_groups[group]
            first = int(self._first_in_file[group]) + lo

            def locate(row: int, file: int = rg.file, first: int = first) -> str:
                return self.files.where(file, first + row)

            parts.append((self._groups.get(group).slice(lo, hi - lo), locate))
            g += 1
        return parts


def rebatch(chunks: Iterator[Columns], batch_size: int) -> Iterator[Columns]:
    """``chunks`` cut and joined into batches of exactly ``batch_size`` rows (a last partial batch of
    a finite stream is yielded too)."""
    from rec.data.columns import concat

    pending: list[Columns] = []
    held = 0
    for chunk in chunks:
        start = 0
        while start < len(chunk):
            take = min(batch_size - held, len(chunk) - start)
            pending.append(chunk.slice(start, start + take) if (start, take) != (0, len(chunk)) else chunk)
            held += take
            start += take
            if held == batch_size:
                yield concat(pending)
                pending, held = [], 0
    if pending:
        yield concat(pending)


def _open(path: str, layout: DataLayout, reading: Reading, what: str) -> ParquetSource:
    from rec.data.files import open_data

    return ParquetSource.open(open_data(path, what), layout, seed=reading.seed, shuffle=reading.shuffle,
                              window=reading.window, policy=reading.ids, what=what, threads=reading.threads)


KIND = SourceKind("parquet", reads=lambda path: True, open=_open)
