"""Synthetic training data: ids that honour each table's rows and pooling factor, without a file.

Per sample and feature, Poisson(``pooling_factor``) ids (a pooled feature's bag, or an unpooled
feature's sequence) drawn as ``rows x u**ID_SKEW``: a few hot rows and a long tail, the skew the
cost model's distinct-row terms assume (``rec.cost.unique``). ``distinct`` batches are drawn once
and cycled, so that drawing stays out of the timed loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from rec.cost.unique import ID_SKEW
from rec.data.columns import Columns
from rec.data.layout import DataLayout
from rec.data.order import Position
from rec.data.source import Extent
from rec.spec.types import Spec, TableSpec

CLICK_RATE = 0.25  # synthetic labels: 1 with this probability


def feature_tables(spec: Spec | tuple[TableSpec, ...]) -> list[tuple[str, int, float]]:
    """(feature, rows of its table, pooling factor) in the module's feature order (spec order)."""
    tables = spec.tables if isinstance(spec, Spec) else spec
    return [(f, t.num_embeddings, t.pooling_factor) for t in tables for f in t.feature_names]


def synthetic_columns(spec: Spec, batch_size: int, dense_in_features: int, rng: np.random.Generator) -> Columns:
    """One batch in ``DataLayout.per_feature(spec)``: module by module, each feature's ids drawn for
    its table (Poisson(pooling factor) per sample, ``rows x u**ID_SKEW``), then dense and labels."""
    lengths, offsets, values = [], [], []
    for path in spec.modules:
        for _, rows, pooling_factor in feature_tables(tuple(t for t in spec.tables if t.module == path)):
            n = rng.poisson(pooling_factor, size=batch_size).astype(np.int32)
            lengths.append(n)
            offsets.append(np.concatenate([[0], np.cumsum(n, dtype=np.int64)]))
            values.append((rows * rng.random(int(n.sum())) ** ID_SKEW).astype(np.int64))
    dense = rng.random((batch_size, dense_in_features), np.float32)
    labels = (rng.random(batch_size) < CLICK_RATE).astype(np.float32)
    return Columns(labels, dense, tuple(lengths), tuple(offsets), tuple(values))


@dataclass
class SyntheticSource:
    """Endless synthetic batches: ``distinct`` of them per rank, drawn once (seeded by the rank), cycled."""

    spec: Spec
    dense_in_features: int
    seed: int
    distinct: int
    _made: dict[tuple[int, int], list[Columns]] = field(default_factory=dict, repr=False)

    @property
    def layout(self) -> DataLayout:
        return DataLayout.per_feature(self.spec, self.dense_in_features)

    @property
    def description(self) -> str:
        return f"synthetic ({self.distinct} distinct batches per rank, cycled)"

    def advance(self, position: Position, rows: int) -> Position:
        return Position(position.world_size, 0, position.rows + rows)

    def identity(self) -> dict[str, object]:
        return {"seed": self.seed, "shuffle": None, "window": None, "dataset": "synthetic"}

    def extent(self, end: Position) -> Extent:
        return Extent("synthetic", 0, 0, 0.0, shuffled=False)

    def batches(self, position: Position, rank: int, batch_size: int) -> Iterator[Columns]:
        key = (rank, batch_size)
        if key not in self._made:
            rng = np.random.default_rng(self.seed + rank)
            self._made[key] = [synthetic_columns(self.spec, batch_size, self.dense_in_features, rng)
                               for _ in range(self.distinct)]
        made = self._made[key]
        start = position.rows // batch_size % len(made)
        while True:
            yield from islice(made, start, None)
            start = 0
