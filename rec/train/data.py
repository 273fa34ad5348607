"""Training input: synthetic batches that honour each table's rows and pooling factor, or
Parquet files.

Parquet columns: ``label`` (0/1), ``dense`` (list<float>, ``dense_in_features`` long) and one
``list<int64>`` column per feature name holding that sample's ids. Rank r reads rows r, r+W, ...
Data that cannot work is an InputError: the launcher checks the columns before any process starts
(``data_problems``, no torch), and a rank that finds a problem does not get retried.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import cycle
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rec.errors import InputError, Problem
from rec.spec.types import Spec

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch

DATA_COLUMNS = ("label", "dense")  # besides one column per feature name

ID_SKEW = 3.0  # ids = rows * u**ID_SKEW: a few hot rows, a long tail, as in click logs


def feature_tables(spec: Spec) -> list[tuple[str, int, float]]:
    """(feature, rows of its table, pooling factor) in the EBC's feature order."""
    return [(f, t.num_embeddings, t.pooling_factor) for t in spec.tables for f in t.feature_names]


def data_problems(path: str, feature_names: Sequence[str]) -> list[Problem]:
    """What makes ``path`` unusable as training data, from its schema alone."""
    if not Path(path).exists():
        return [Problem(f"--data {path}", "no such file or directory")]
    import pyarrow.dataset as ds

    try:
        columns = set(ds.dataset(path, format="parquet").schema.names)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        return [Problem(f"--data {path}", f"cannot read it as Parquet: {e}")]
    missing = [c for c in (*DATA_COLUMNS, *feature_names) if c not in columns]
    if missing:
        return [Problem(f"--data {path}", f"missing columns {', '.join(missing)} (needs label, dense and "
                                          "one list<int64> column per feature name)")]
    return []


def synthetic_batch(spec: Spec, batch_size: int, dense_in_features: int,
                    rng: np.random.Generator) -> Batch:
    """One batch: Poisson(pooling_factor) ids per sample and feature, skewed toward hot rows."""
    import torch
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

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
    import torch
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    features = [f for f, _, _ in feature_tables(spec)]
    problems = data_problems(path, features)
    if problems:
        raise InputError("Cannot train on this data:", problems)
    table = ds.dataset(path, format="parquet").to_table()
    rows = np.arange(rank, table.num_rows, world_size)
    usable = len(rows) // batch_size * batch_size
    if usable == 0:
        raise InputError("Cannot train on this data:", [Problem(
            f"--data {path}", f"{table.num_rows} rows give rank {rank} of {world_size} no full batch of "
                              f"{batch_size}; use a smaller --batch-size or more rows")])
    table = table.take(rows[:usable])
    made = []
    for start in range(0, usable, batch_size):
        chunk = table.slice(start, batch_size)
        dense = np.asarray(chunk.column("dense").to_pylist(), dtype=np.float32)
        if dense.shape[1] != dense_in_features:
            raise InputError("Cannot train on this data:", [Problem(
                f"--data {path}", f"dense has {dense.shape[1]} values per sample, --dense-in-features "
                                  f"is {dense_in_features}")])
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
