"""Synthetic training data: ids that honour each table's rows, pooling factor and hit-rate curve,
without a file.

Per sample and feature, Poisson(``pooling_factor``) ids (a pooled feature's bag, or an unpooled
feature's sequence). Each id is the ``r``-th hottest row of its table for a uniform ``u``
(``rec.hit_rates.row_of``): through the table's measured ``hit_rate_curve`` where it has one
(``shardflow spec stats``), else the skew model ``rows x u**ID_SKEW`` (a few hot rows and a long
tail, what the cost model's distinct-row terms assume, ``rec.cost.unique``). The hottest rows are
then scattered over the table (``rec.hit_rates.spread``, a bijection), as hashed ids are, so every
row-wise shard sees the table's skew rather than shard 0 holding its head. A weighted table's ids
(``is_weighted``) each get a weight uniform in (0, 1], float32. ``distinct`` batches are drawn once
and cycled, so that drawing stays out of the timed loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from rec.data.columns import Columns
from rec.data.layout import DataLayout
from rec.data.order import Position
from rec.data.source import Extent
from rec.hit_rates import Curve, row_of, spread
from rec.spec.types import Spec, TableSpec

CLICK_RATE = 0.25  # synthetic labels: 1 with this probability
SYNTHETIC = "synthetic"  # the source's name, and its dataset in a checkpoint's data position


def feature_tables(spec: Spec | tuple[TableSpec, ...]) -> list[tuple[str, TableSpec]]:
    """(feature, its table) in the module's feature order (spec order)."""
    tables = spec.tables if isinstance(spec, Spec) else spec
    return [(f, t) for t in tables for f in t.feature_names]


def table_ids(u: np.ndarray, rows: int, curve: Curve | None = None) -> np.ndarray:
    """A table's ids for uniform ``u``: drawn from its hit-rate curve (None: the skew model), the hot
    rows scattered over the table."""
    return spread(row_of(u, rows, curve), rows)


def synthetic_weights(count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` weights of a weighted table's ids: uniform in (0, 1], float32."""
    return 1 - rng.random(count, np.float32)


def synthetic_columns(spec: Spec, batch_size: int, dense_in_features: int, rng: np.random.Generator) -> Columns:
    """One batch in ``DataLayout.per_feature(spec)``: module by module, each feature's ids drawn for
    its table (Poisson(pooling factor) per sample, ``table_ids``; a weighted table's then their
    weights, ``synthetic_weights``), then dense and labels."""
    lengths, offsets, values, weights = [], [], [], []
    for path in spec.modules:
        for _, table in feature_tables(tuple(t for t in spec.tables if t.module == path)):
            n = rng.poisson(table.pooling_factor, size=batch_size).astype(np.int32)
            count = int(n.sum())
            lengths.append(n)
            offsets.append(np.concatenate([[0], np.cumsum(n, dtype=np.int64)]))
            values.append(table_ids(rng.random(count), table.num_embeddings, table.hit_rate_curve))
            weights.append(synthetic_weights(count, rng) if table.is_weighted else None)
    dense = rng.random((batch_size, dense_in_features), np.float32)
    labels = (rng.random(batch_size) < CLICK_RATE).astype(np.float32)
    return Columns(labels, dense, tuple(lengths), tuple(offsets), tuple(values), tuple(weights))


@dataclass
class SyntheticSource:
    """Endless synthetic batches: ``distinct`` of them per rank, drawn once (seeded by the rank), cycled;
    each table's ids from its hit-rate curve (else the skew model), hot rows scattered (module doc)."""

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

    def position_problem(self, position: Position) -> str | None:
        return None  # batches cycled without end: any number of rows read is a place in them

    def identity(self) -> dict[str, object]:
        return {"seed": self.seed, "shuffle": None, "window": None, "dataset": SYNTHETIC}

    def extent(self, end: Position) -> Extent:
        return Extent(SYNTHETIC, 0, 0, 0.0, shuffled=False)

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
