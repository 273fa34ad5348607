"""Each table's statistics measured from a sample of training data (``rec.data.sample``), and
the spec that holds them (``shardflow spec stats``; docs/spec.md, "Statistics from your data").

Per table, over the ids of all its features:

- ``pooling_factor``: the mean over its features of the mean ids per sample, i.e. the table's ids
  per sample divided by its feature count. The cost model gives every feature of a table that one
  pooling factor (TorchRec's ``pooling_factors=[pooling_factor] * len(feature_names)``), so
  ``pooling_factor * features`` is the table's ids per sample, as measured;
- ``distinct_per_batch``: the mean, over consecutive batches of ``batch_size`` samples of the sample
  (full batches only, or one batch of every sample when there are fewer), of the number of distinct
  ids the table is fed in a batch, in range or not;
- ``ids_out_of_range``: sampled ids outside ``[0, num_embeddings)``;
- ``hit_rate_curve``: for a cache of each of ``CACHE_FRACTIONS`` of the table's rows
  (``floor(fraction * num_embeddings)`` rows, its most frequent in the sample; rows never seen count
  as zero), the share of the sample's in-range lookups it serves.

Counting is vectorized: ``np.bincount`` where the value range is small against the ids, a sort
otherwise; nothing loops over ids or samples in Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from rec import progress
from rec.hit_rates import CACHE_FRACTIONS
from rec.settings import knob
from rec.spec.columns import table_to_row
from rec.spec.types import Spec, TableSpec
from rec.spec.validate import spec_from_rows
from rec.topology.types import BATCH_SIZE, MAX_SAMPLES_PER_STEP

if TYPE_CHECKING:
    from rec.data.sample import IdSample

SAMPLE_ROWS = 1_000_000
DIGITS = 6  # significant digits the measured numbers are written with
_DENSE_SLACK = 1 << 20  # bincount over up to (ids * 4 + this) values: cheaper than sorting the ids


@dataclass(frozen=True)
class StatsSettings:
    """How much of the data ``shardflow spec stats`` reads, and how it batches it."""

    sample_rows: int = field(default=SAMPLE_ROWS, metadata=knob(
        "rows to read, in whole row groups chosen at random (all rows when the data holds fewer)", minimum=1))
    batch_size: int = field(default=BATCH_SIZE, metadata=knob(
        "samples per batch for distinct_per_batch (a topology's batch_size: the batch per rank)", minimum=1,
        maximum=MAX_SAMPLES_PER_STEP))
    seed: int = field(default=0, metadata=knob("seed of the row groups' random choice", minimum=0))


@dataclass(frozen=True)
class TableStats:
    """What the sample shows of one table (``key``: ``TableSpec.key``)."""

    key: str
    rows: int  # samples measured
    batch_size: int
    ids: int  # ids the table's features hold in the sample
    pooling_factor: float | None  # None: the sample holds no id of the table
    distinct_per_batch: float
    ids_out_of_range: int
    hit_rate_curve: tuple[tuple[float, float], ...] | None  # None: no id in range


def spec_stats(spec: Spec, sample: IdSample, batch_size: int = BATCH_SIZE) -> tuple[TableStats, ...]:
    """Every table's statistics, in spec order."""
    out = []
    for i, t in enumerate(spec.tables):
        columns = t.feature_names
        out.append(table_stats(t, [sample.lengths[c] for c in columns], [sample.ids[c] for c in columns], batch_size))
        progress.update(f"{i + 1:,} of {len(spec):,} tables", i + 1, len(spec))
    return tuple(out)


def table_stats(table: TableSpec, lengths: Sequence[np.ndarray], ids: Sequence[Sequence[np.ndarray]],
                batch_size: int) -> TableStats:
    """One table's statistics from its features' ids: per feature, the ids of each sample (int32) and
    all its ids in order (int64), in parts."""
    rows = len(lengths[0])
    batches = max(rows // batch_size, 1)
    used = batches * batch_size if rows >= batch_size else rows  # full batches, or one of every sample
    batch = []
    for n, parts in zip(lengths, ids, strict=True):
        per_batch = n[:used].reshape(batches, -1).sum(axis=1, dtype=np.int64)
        # The ids after the last full batch go to batch number ``batches``, which no batch counts.
        per_batch = np.append(per_batch, sum(map(len, parts)) - per_batch.sum())
        batch.append(np.repeat(np.arange(batches + 1, dtype=np.int64), per_batch))
    counted = IdCounts.of(_join([part for parts in ids for part in parts]), _join(batch), batches)
    inside = (counted.values >= 0) & (counted.values < table.num_embeddings)
    lookups = counted.counts[inside]
    total = int(counted.counts.sum())
    return TableStats(
        # a sample smaller than one batch is counted as one batch of every sample: of that size
        key=table.key, rows=rows, batch_size=min(batch_size, max(rows, 1)), ids=total,
        pooling_factor=_round(total / (rows * len(lengths))) if total else None,
        distinct_per_batch=_round(counted.pairs / batches),
        ids_out_of_range=total - int(lookups.sum()),
        hit_rate_curve=hit_rate_curve(lookups, table.num_embeddings),
    )


@dataclass(frozen=True)
class IdCounts:
    """The distinct ids of a table's sample with how often each occurs, and how many distinct
    (batch, id) pairs the full batches hold (the sum over batches of their distinct ids)."""

    values: np.ndarray  # int64, the distinct ids, ascending
    counts: np.ndarray  # int64, occurrences of each
    pairs: int

    @classmethod
    def of(cls, ids: np.ndarray, batch: np.ndarray, batches: int) -> IdCounts:
        """Count ``ids`` (int64), each in batch ``batch`` (``batches``: after the last full batch).

        One key per id, ``id * (batches + 1) + batch``, counted once: by ``np.bincount`` where the
        keys' range is small against the ids, by one sort otherwise. Ids spread wider than a key
        holds (hashed ids, say) are numbered by rank first."""
        if not len(ids):
            empty = np.zeros(0, np.int64)
            return cls(empty, empty, 0)
        width = batches + 1
        low = int(ids.min())
        span = int(ids.max()) - low + 1
        distinct: np.ndarray | None = None
        if span * width >= 1 << 62:
            ordered = np.sort(ids)
            distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
            low, span, ids = 0, len(distinct), np.searchsorted(distinct, ids).astype(np.int64)
        key = (ids - low) * width + batch
        if span * width <= 4 * len(ids) + _DENSE_SLACK:
            per_pair = np.bincount(key, minlength=span * width).reshape(span, width)
            pairs = int(np.count_nonzero(per_pair[:, :batches]))
            per_id = per_pair.sum(axis=1)
            code = np.flatnonzero(per_id)
            counts = per_id[code]
        else:
            if span * width <= 1 << 32:
                key = key.astype(np.uint32)  # sorts in 60% of the time
            key.sort()
            new = np.concatenate(([True], key[1:] != key[:-1]))
            pairs = int(np.count_nonzero(new & (key % width != batches)))
            code = (key // width).astype(np.int64)
            starts = np.flatnonzero(np.concatenate(([True], code[1:] != code[:-1])))
            counts = np.diff(np.append(starts, len(code)))
            code = code[starts]
        values = code + low if distinct is None else distinct[code]
        return cls(values.astype(np.int64, copy=False), counts.astype(np.int64, copy=False), pairs)


def hit_rate_curve(lookups: np.ndarray, rows: int, fractions: Sequence[float] = CACHE_FRACTIONS
                   ) -> tuple[tuple[float, float], ...] | None:
    """(fraction, share of the lookups that the ``floor(fraction * rows)`` most looked-up rows serve)
    per fraction, given each looked-up row's count of ``lookups``; None when there is none."""
    total = int(lookups.sum())
    if not total:
        return None
    ranked = np.sort(lookups)[::-1]
    served = np.concatenate(([0], np.cumsum(ranked)))
    cached = [min(math.floor(Fraction(repr(f)) * rows), len(ranked)) for f in fractions]  # an exact floor
    return tuple((f, _round(int(served[k]) / total)) for f, k in zip(fractions, cached, strict=True))


def with_stats(spec: Spec, stats: Sequence[TableStats], source: str = "") -> Spec:
    """``spec`` with each table's measured statistics and pooling factor (a table whose sample
    holds no id keeps its pooling factor), validated as any spec is."""
    rows = []
    for t, s in zip(spec.tables, stats, strict=True):
        row = table_to_row(t)
        row.update(stats_rows=s.rows, stats_batch_size=s.batch_size, distinct_per_batch=s.distinct_per_batch,
                   ids_out_of_range=s.ids_out_of_range,
                   hit_rate_curve=None if s.hit_rate_curve is None else [list(p) for p in s.hit_rate_curve])
        if s.pooling_factor is not None:
            row["pooling_factor"] = s.pooling_factor
        rows.append(row)
    return spec_from_rows(rows, source=source)


def _round(value: float) -> float:
    return float(f"{value:.{DIGITS}g}")


def _join(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
