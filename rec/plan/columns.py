"""A plan's tables as columns: what building, validating and writing 100,000 tables reads.

``TableColumns`` is a ``Sequence[TablePlan]``: ``plan.tables[i]`` builds the i-th table on demand,
so code that looks at a few tables reads as before, while the hot paths (``rec.plan.io``,
``rec.plan.validate``) read the arrays. Shards are in CSR layout: table i owns entries
``shard_start[i]:shard_start[i + 1]``; a replicated (data_parallel) table has one entry, its
replica, standing for one on every rank.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from rec.plan.types import Replicas, Shard, TablePlan
from rec.sharding import COMPUTE_KERNELS, SHARDING_TYPES, ST_CODE, ShardingType
from rec.spec.types import DEFAULT_MODULE, table_key

DATA_PARALLEL = ST_CODE[ShardingType.DATA_PARALLEL]
SHARD_FIELDS = ("rank", "row_offset", "col_offset", "rows", "cols")


@dataclass(frozen=True, eq=False)
class TableColumns(Sequence[TablePlan]):
    names: tuple[str, ...]
    sharding_type: np.ndarray  # (T,) int8 code into SHARDING_TYPES
    compute_kernel: np.ndarray  # (T,) int8 code into COMPUTE_KERNELS
    perf: np.ndarray  # (T,) float64
    hbm: np.ndarray  # (T,) int64
    ddr: np.ndarray  # (T,) int64
    replicated: np.ndarray  # (T,) bool
    shard_start: np.ndarray  # (T+1,) int64
    rank: np.ndarray  # (E,) int64; a replica's is 0 and stands for every rank
    row_offset: np.ndarray
    col_offset: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    world_size: int
    modules: tuple[str, ...] = ()  # each table's module; left empty: every table in DEFAULT_MODULE
    load_factor: np.ndarray | None = None  # (T,) float64 TablePlan.cache_load_factor, NaN for None; None: all NaN

    def __post_init__(self) -> None:
        if not self.modules:
            object.__setattr__(self, "modules", (DEFAULT_MODULE,) * len(self.names))
        if self.load_factor is None:
            object.__setattr__(self, "load_factor", np.full(len(self.names), np.nan))

    @functools.cached_property
    def keys(self) -> tuple[str, ...]:
        """Every table's key (``rec.spec.types.table_key``): unique in a sound plan."""
        return tuple(map(table_key, self.modules, self.names))

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, i: int) -> TablePlan: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[TablePlan, ...]: ...
    def __getitem__(self, i: int | slice) -> TablePlan | tuple[TablePlan, ...]:
        if isinstance(i, slice):
            return tuple(self[k] for k in range(*i.indices(len(self))))
        i = range(len(self))[i]
        lo, hi = int(self.shard_start[i]), int(self.shard_start[i + 1])
        shards = tuple(Shard(int(r), (int(a), int(b)), (int(c), int(d))) for r, a, b, c, d in zip(
            self.rank[lo:hi], self.row_offset[lo:hi], self.col_offset[lo:hi], self.rows[lo:hi], self.cols[lo:hi],
            strict=True))
        seq_shards: Sequence[Shard] = shards
        ranks: Sequence[int] = tuple(s.rank for s in shards)
        if self.replicated[i]:
            seq_shards, ranks = Replicas(shards[0], self.world_size), range(self.world_size)
        lf = float(self.load_factor[i])  # type: ignore[index]
        return TablePlan(self.names[i], SHARDING_TYPES[self.sharding_type[i]], COMPUTE_KERNELS[self.compute_kernel[i]],
                         ranks, seq_shards, float(self.perf[i]), int(self.hbm[i]), int(self.ddr[i]), self.modules[i],
                         None if np.isnan(lf) else lf)

    def __iter__(self) -> Iterator[TablePlan]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TableColumns):
            same = (self.names, self.modules, self.world_size) == (other.names, other.modules, other.world_size)
            return same and all(np.array_equal(getattr(self, f), getattr(other, f)) for f in _ARRAYS) \
                and np.array_equal(self.load_factor, other.load_factor, equal_nan=True)  # type: ignore[arg-type]
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def table_of_entry(self) -> np.ndarray:
        """(E,) the table of every entry."""
        return np.repeat(np.arange(len(self)), np.diff(self.shard_start))


_ARRAYS = ("sharding_type", "compute_kernel", "perf", "hbm", "ddr", "replicated", "shard_start",
           *SHARD_FIELDS)


def columns_of(tables: Sequence[TablePlan], world_size: int) -> TableColumns:
    """``tables`` as columns (themselves when they already are)."""
    if isinstance(tables, TableColumns):
        return tables
    n = len(tables)
    replicated = np.fromiter((isinstance(t.shards, Replicas) for t in tables), bool, n)
    entries: list[tuple[int, int, int, int, int]] = []
    for t in tables:
        if isinstance(t.shards, Replicas):
            r = t.shards.replica
            entries.append((0, *r.offsets, *r.sizes))
        else:
            entries.extend((s.rank, *s.offsets, *s.sizes) for s in t.shards)
    flat = np.array(entries, dtype=np.int64).reshape(-1, 5)
    counts = np.fromiter((1 if isinstance(t.shards, Replicas) else len(t.shards) for t in tables), np.int64, n)
    return TableColumns(
        names=tuple(t.name for t in tables),
        sharding_type=np.fromiter((SHARDING_TYPES.index(t.sharding_type) for t in tables), np.int8, n),
        compute_kernel=np.fromiter((COMPUTE_KERNELS.index(t.compute_kernel) for t in tables), np.int8, n),
        perf=np.fromiter((t.perf for t in tables), np.float64, n),
        hbm=np.fromiter((t.hbm for t in tables), np.int64, n),
        ddr=np.fromiter((t.ddr for t in tables), np.int64, n),
        replicated=replicated,
        shard_start=np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
        **{f: np.ascontiguousarray(flat[:, j]) for j, f in enumerate(SHARD_FIELDS)},
        world_size=world_size,
        modules=tuple(t.module for t in tables),
        load_factor=np.fromiter((np.nan if t.cache_load_factor is None else t.cache_load_factor for t in tables),
                                np.float64, n),
    )

