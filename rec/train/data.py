"""Training input: synthetic batches that honour each table's rows and pooling factor, or
Parquet files.

Parquet columns: ``label`` (0/1), ``dense`` (list<float>, ``dense_in_features`` long) and one
``list<int64>`` column per feature name holding that sample's ids. Rank r reads rows r, r+W, ...
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import cycle

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.spec.types import Spec

ID_SKEW = 3.0  # ids = rows * u**ID_SKEW: a few hot rows, a long tail, as in click logs


def feature_tables(spec: Spec) -> list[tuple[str, int, float]]:
    """(feature, rows of its table, pooling factor) in the EBC's feature order."""
    return [(f, t.num_embeddings, t.pooling_factor) for t in spec.tables for f in t.feature_names]


def synthetic_batch(spec: Spec, batch_size: int, dense_in_features: int,
                    rng: np.random.Generator) -> Batch:
    """One batch: Poisson(pooling_factor) ids per sample and feature, skewed toward hot rows."""
    features = feature_tables(spec)
    lengths, values = [], []
    for _, rows, pooling_factor in features:
        n = rng.poisson(pooling_factor, size=batch_size)
        lengths.append(n)
        values.append((rows * rng.random(int(n.sum())) ** ID_SKEW).astype(np.int64))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f for f, _, _ in features],
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int32)),
    )
    return Batch(
        dense_features=torch.from_numpy(rng.random((batch_size, dense_in_features), np.float32)),
        sparse_features=kjt,
        labels=torch.from_numpy((rng.random(batch_size) < 0.25).astype(np.float32)),
    )


def synthetic_batches(spec: Spec, batch_size: int, dense_in_features: int, seed: int,
                      distinct: int, pin_memory: bool = False) -> Iterator[Batch]:
    """An endless stream cycling ``distinct`` pre-made batches (generation stays out of the
    timed loop); pinned host memory on GPU so copies can overlap compute."""
    rng = np.random.default_rng(seed)
    made = [synthetic_batch(spec, batch_size, dense_in_features, rng) for _ in range(distinct)]
    if pin_memory:
        made = [b.pin_memory() for b in made]
    return cycle(made)


def parquet_batches(path: str, spec: Spec, batch_size: int, dense_in_features: int, rank: int,
                    world_size: int, pin_memory: bool = False) -> Iterator[Batch]:
    """Batches from Parquet rows (this rank's share), cycled so any iteration count works."""
    import pyarrow.dataset as ds

    table = ds.dataset(path, format="parquet").to_table()
    features = [f for f, _, _ in feature_tables(spec)]
    missing = [c for c in ["label", "dense", *features] if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    rows = np.arange(rank, table.num_rows, world_size)
    usable = len(rows) // batch_size * batch_size
    if usable == 0:
        raise ValueError(f"{path}: {table.num_rows} rows give rank {rank} no full batch of {batch_size}")
    table = table.take(rows[:usable])
    made = []
    for start in range(0, usable, batch_size):
        chunk = table.slice(start, batch_size)
        dense = np.asarray(chunk.column("dense").to_pylist(), dtype=np.float32)
        if dense.shape[1] != dense_in_features:
            raise ValueError(f"{path}: dense has {dense.shape[1]} values, expected {dense_in_features}")
        ids = [chunk.column(f).to_pylist() for f in features]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=features,
            values=torch.tensor([i for col in ids for sample in col for i in sample], dtype=torch.int64),
            lengths=torch.tensor([len(sample) for col in ids for sample in col], dtype=torch.int32),
        )
        batch = Batch(torch.from_numpy(dense), kjt,
                      torch.tensor(chunk.column("label").to_pylist(), dtype=torch.float32))
        made.append(batch.pin_memory() if pin_memory else batch)
    return cycle(made)
