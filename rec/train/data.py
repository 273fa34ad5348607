"""Training input: synthetic batches that honour each table's rows and pooling factor, or
Parquet files.

A spec of one EmbeddingBagCollection at the default path (``one_default_ebc``) gets TorchRec's
``Batch`` (one KJT, shardflow's DLRM); any other a ``ModuleBatch``: one KJT per embedding module, so
each module is fed its own features. An unpooled (EmbeddingCollection) feature's ids per sample are
its sequence, as long as a Poisson(pooling_factor) draw, like a pooled feature's bag.

Parquet columns: ``label`` (0/1), ``dense`` (list<float>, ``dense_in_features`` long) and one
``list<int64>`` column per feature name holding that sample's ids (a feature name that several
modules use is one column, fed to each). Rank r reads rows r, r+W, ...
Data that cannot work is an InputError: the launcher checks the columns before any process starts
(``data_problems``, no torch), and a rank that finds a problem does not get retried.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import cycle
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rec.cost.unique import ID_SKEW
from rec.errors import InputError, Problem
from rec.spec.types import Spec, TableSpec
from rec.train.tables import one_default_ebc

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rec.train.batch import ModuleBatch

DATA_COLUMNS = ("label", "dense")  # besides one column per feature name


def feature_tables(spec: Spec | tuple[TableSpec, ...]) -> list[tuple[str, int, float]]:
    """(feature, rows of its table, pooling factor) in the module's feature order (spec order)."""
    tables = spec.tables if isinstance(spec, Spec) else spec
    return [(f, t.num_embeddings, t.pooling_factor) for t in tables for f in t.feature_names]


def module_tables(spec: Spec) -> dict[str, tuple[TableSpec, ...]]:
    """Each embedding module's tables, modules in model order, tables in spec order."""
    return {path: tuple(t for t in spec.tables if t.module == path) for path in spec.modules}


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


def synthetic_kjt(tables: Spec | tuple[TableSpec, ...], batch_size: int, rng: np.random.Generator) -> KeyedJaggedTensor:
    """The features of ``tables`` for one batch: Poisson(pooling_factor) ids per sample and
    feature (a bag, or an unpooled feature's sequence), skewed toward hot rows."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    features = feature_tables(tables)
    lengths, values = [], []
    for _, rows, pooling_factor in features:
        n = rng.poisson(pooling_factor, size=batch_size)
        lengths.append(n)
        values.append((rows * rng.random(int(n.sum())) ** ID_SKEW).astype(np.int64))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f for f, _, _ in features],
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int32)),
    )


def synthetic_batch(spec: Spec, batch_size: int, dense_in_features: int,
                    rng: np.random.Generator) -> Batch:
    """One TorchRec ``Batch``: every feature of the spec in one KJT (``synthetic_kjt``)."""
    import torch
    from torchrec.datasets.utils import Batch

    kjt = synthetic_kjt(spec, batch_size, rng)
    return Batch(
        dense_features=torch.from_numpy(rng.random((batch_size, dense_in_features), np.float32)),
        sparse_features=kjt,
        labels=torch.from_numpy((rng.random(batch_size) < 0.25).astype(np.float32)),
    )


def synthetic_module_batch(spec: Spec, batch_size: int, dense_in_features: int,
                           rng: np.random.Generator) -> ModuleBatch:
    """One ``ModuleBatch``: each embedding module's features in a KJT of its own."""
    import torch

    from rec.train.batch import ModuleBatch

    sparse = {path: synthetic_kjt(tables, batch_size, rng) for path, tables in module_tables(spec).items()}
    return ModuleBatch(
        dense_features=torch.from_numpy(rng.random((batch_size, dense_in_features), np.float32)),
        sparse_features=sparse,
        labels=torch.from_numpy((rng.random(batch_size) < 0.25).astype(np.float32)),
    )


def synthetic_batches(spec: Spec, batch_size: int, dense_in_features: int, seed: int,
                      distinct: int, pin_memory: bool = False) -> Iterator[Batch | ModuleBatch]:
    """An endless stream cycling ``distinct`` pre-made batches (generation stays out of the
    timed loop); pinned host memory on GPU so copies can overlap compute."""
    rng = np.random.default_rng(seed)
    make = synthetic_batch if one_default_ebc(spec) else synthetic_module_batch
    made: list[Batch | ModuleBatch] = [make(spec, batch_size, dense_in_features, rng) for _ in range(distinct)]
    if pin_memory:
        made = [b.pin_memory() for b in made]
    return cycle(made)


def parquet_batches(path: str, spec: Spec, batch_size: int, dense_in_features: int, rank: int,
                    world_size: int, pin_memory: bool = False) -> Iterator[Batch | ModuleBatch]:
    """Batches from Parquet rows (this rank's share), cycled so any iteration count works."""
    import pyarrow.dataset as ds
    import torch
    from torchrec.datasets.utils import Batch

    from rec.train.batch import ModuleBatch

    features = list(dict.fromkeys(f for f, _, _ in feature_tables(spec)))
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
    modules = module_tables(spec)
    made: list[Batch | ModuleBatch] = []
    for start in range(0, usable, batch_size):
        chunk = table.slice(start, batch_size)
        dense = np.asarray(chunk.column("dense").to_pylist(), dtype=np.float32)
        if dense.shape[1] != dense_in_features:
            raise InputError("Cannot train on this data:", [Problem(
                f"--data {path}", f"dense has {dense.shape[1]} values per sample, --dense-in-features "
                                  f"is {dense_in_features}")])
        ids = {f: chunk.column(f).to_pylist() for f in features}
        labels = torch.tensor(chunk.column("label").to_pylist(), dtype=torch.float32)
        batch: Batch | ModuleBatch
        if one_default_ebc(spec):
            batch = Batch(torch.from_numpy(dense), _kjt(spec.tables, ids), labels)
        else:
            batch = ModuleBatch(torch.from_numpy(dense), {p: _kjt(t, ids) for p, t in modules.items()}, labels)
        made.append(batch.pin_memory() if pin_memory else batch)
    return cycle(made)


def _kjt(tables: tuple[TableSpec, ...], ids: dict[str, list[list[int]]]) -> KeyedJaggedTensor:
    """The KJT of ``tables``' features from each feature's ids per sample."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = [f for f, _, _ in feature_tables(tables)]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.tensor([i for f in keys for sample in ids[f] for i in sample], dtype=torch.int64),
        lengths=torch.tensor([len(sample) for f in keys for sample in ids[f]], dtype=torch.int32),
    )
