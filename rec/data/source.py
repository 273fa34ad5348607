"""Where a training's batches come from: one small interface, the sources behind it, and the choice.

A ``DataSource`` gives each rank its batches from a ``Position`` (``rec.data.order``) and says how a
position moves on; the training job turns its ``Columns`` into TorchRec batches
(``rec.train.input``). ``SOURCES`` lists the sources that read ``--data``, tried in order; a source
is one module with a ``KIND``, plus its line here. Without ``--data`` the job trains on
``SyntheticSource``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from rec.data.columns import Columns
from rec.data.ids import IdsPolicy
from rec.data.layout import DataLayout
from rec.data.order import Position
from rec.spec.types import Spec


class DataSource(Protocol):
    @property
    def layout(self) -> DataLayout:
        """Which id slots the source's ``Columns`` hold and how they feed the model's modules."""

    @property
    def description(self) -> str:
        """What the data is, in a few words (logs, summaries)."""

    def advance(self, position: Position, rows: int) -> Position:
        """``position`` after every rank has read ``rows`` more rows."""

    def position_problem(self, position: Position) -> str | None:
        """Why ``position`` (read back from a checkpoint) is no place in this source; None if it is one."""

    def batches(self, position: Position, rank: int, batch_size: int) -> Iterator[Columns]:
        """Rank ``rank``'s batches of ``batch_size`` rows from ``position`` on, without end."""

    def identity(self) -> dict[str, object]:
        """What a position in this source means, for a checkpoint to keep beside it (plain JSON
        values: the data's fingerprint and the settings of its order): a resume reads on from the
        position only when they are the same."""

    def extent(self, end: Position) -> Extent:
        """What the source holds, and how far a training that ends at ``end`` has read it."""


@dataclass(frozen=True)
class Extent:
    source: str  # as the user named it (synthetic: "synthetic")
    rows: int  # 0 where it has no end
    files: int
    epochs: float  # read by the end, counted in each rank's share
    shuffled: bool  # read in a shuffled order


@dataclass(frozen=True)
class Reading:
    """How a source reads: the seed of its order, whether it shuffles and how widely, the ids policy."""

    seed: int = 0
    shuffle: bool = True
    window: int = 1 << 16
    ids: IdsPolicy = IdsPolicy.ERROR
    threads: int = 1  # readers, each a window at a time


@dataclass(frozen=True)
class SourceKind:
    """A source that reads ``--data``: whether it reads ``path``, and how it opens it."""

    name: str
    reads: Callable[[str], bool]
    open: Callable[[str, DataLayout, Reading, str], DataSource]  # (path, layout, reading, what) -> source


def _parquet() -> SourceKind:
    from rec.data.parquet import KIND

    return KIND


SOURCES: tuple[Callable[[], SourceKind], ...] = (_parquet,)
MAX_AUTO_THREADS = 4  # readers per rank chosen for the user: beyond, ranks' other threads starve


def reader_threads(requested: int | None, ranks_here: int) -> int:
    """The threads a rank reads with: ``requested``, or the cores this process may use per rank on
    this machine, at most ``MAX_AUTO_THREADS``."""
    if requested is not None:
        return requested
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_AUTO_THREADS, cores // max(1, ranks_here)))


def open_source(data: str | None, spec: Spec, layout: DataLayout, reading: Reading, *,
                distinct: int = 16, what: str = "--data") -> DataSource:
    """The source of ``data`` (the first in ``SOURCES`` that reads it), or synthetic batches for None."""
    if data is None:
        from rec.data.synthetic import SyntheticSource

        return SyntheticSource(spec, layout.dense_in_features, reading.seed, distinct)
    for kind in SOURCES:
        source = kind()
        if source.reads(data):
            return source.open(data, layout, reading, what)
    raise ValueError(f"no source reads {data}")
