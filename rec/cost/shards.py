"""Shard sizes and offsets per sharding type, as TorchRec's ``calculate_shard_sizes_and_offsets``.

Layouts are run-length encoded (see ``rec.cost.types``): a row split over N ranks is at most three
runs (full blocks, the remainder, empty shards), so its size does not grow with the world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rec.cost.constants import MIN_CW_DIM
from rec.sharding import ShardingType


@dataclass(frozen=True)
class Layout:
    """Shard runs of one sharding type for n tables; the runs of one table are contiguous."""

    count: np.ndarray  # (n,) runs per table
    owner: np.ndarray  # (E,) which of the n tables a run belongs to
    rows: np.ndarray  # (E,) int64
    cols: np.ndarray  # (E,) int64
    row_offset: np.ndarray  # (E,) int64
    col_offset: np.ndarray  # (E,) int64
    repeat: np.ndarray  # (E,) int64 shards in the run
    row_step: np.ndarray  # (E,) int64


@lru_cache(maxsize=4096)
def _cw_block(dim: int, min_partition: int) -> int:
    """``sharding_plan._get_block_size_for_cw_shard(dim, min_partition or None)``."""
    lower = min_partition or MIN_CW_DIM
    base = next((i for i in range(lower, dim) if dim % i == 0 and i % 4 == 0), dim)
    block = min(base, dim)
    return dim if dim % block else block


def column_block(dims: np.ndarray, min_partition: np.ndarray | None = None) -> np.ndarray:
    """Column-wise shard width per table: the least multiple of 4 dividing the dim from the table's
    ``min_partition`` on (0: ``MIN_CW_DIM``), the whole dim if none does."""
    lower = np.zeros(len(dims), np.int64) if min_partition is None else min_partition
    pairs, inv = np.unique(np.stack([dims, lower], axis=1), axis=0, return_inverse=True)
    blocks = [_cw_block(int(d), int(m)) for d, m in pairs]
    return np.array(blocks, dtype=np.int64)[inv.reshape(-1)]


def layout(
    sharding_type: ShardingType,
    rows: np.ndarray,
    dims: np.ndarray,
    world_size: int,
    local_world_size: int,
    min_partition: np.ndarray | None = None,
) -> Layout:
    """Shard runs of every table (``rows``/``dims`` of length n) under one sharding type;
    ``min_partition`` (0: none) bounds the width of column shards as TorchRec's constraint does."""
    n = len(rows)
    zeros = np.zeros(n, dtype=np.int64)
    ones = np.ones(n, dtype=np.int64)
    if sharding_type == ShardingType.DATA_PARALLEL:
        # One full replica per rank, all at offset [0, 0].
        return Layout(ones, np.arange(n), rows, dims, zeros, zeros, np.full(n, world_size), zeros)
    if sharding_type == ShardingType.TABLE_WISE:
        return Layout(ones, np.arange(n), rows, dims, zeros, zeros, ones, zeros)
    if sharding_type in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        return _column_split(rows, dims, min_partition)
    if sharding_type == ShardingType.ROW_WISE:
        return _row_split(rows, dims, zeros, world_size)
    if sharding_type == ShardingType.TABLE_ROW_WISE:
        return _row_split(rows, dims, zeros, local_world_size)
    raise ValueError(f"unsupported sharding type {sharding_type}")


def _column_split(rows: np.ndarray, dims: np.ndarray, min_partition: np.ndarray | None) -> Layout:
    """``_calculate_cw_shard_sizes_and_offsets``: dim // block shards of width block."""
    block = column_block(dims, min_partition)
    count = dims // block
    owner = np.repeat(np.arange(len(rows)), count)
    first = np.cumsum(count) - count
    j = np.arange(len(owner)) - first[owner]
    e = len(owner)
    zeros = np.zeros(e, dtype=np.int64)
    width = block[owner]
    return Layout(count, owner, rows[owner], width, zeros, width * j, np.ones(e, np.int64), zeros)


def _row_split(
    rows: np.ndarray, cols: np.ndarray, col_offset: np.ndarray, num_devices: int
) -> Layout:
    """``_calculate_rw_shard_sizes_and_offsets``: ceil(rows / N) per rank, remainder, then zeros."""
    n = len(rows)
    block = np.ceil(rows / num_devices).astype(np.int64)  # math.ceil(hash_size / num_devices)
    last_rank = rows // block
    last = rows - block * last_rank
    partial = (last_rank < num_devices) & (last > 0)
    # Runs per table: [full blocks, the partial block, empty shards]; an empty "last block" joins
    # the empty run so that a table has at most three runs.
    run_rows = np.stack([block, last, np.zeros(n, np.int64)], axis=1)
    run_count = np.stack(
        [last_rank, partial.astype(np.int64), num_devices - last_rank - partial], axis=1
    )
    run_offset = np.stack([np.zeros(n, np.int64), block * last_rank, rows], axis=1)
    keep = run_count > 0
    owner = np.repeat(np.arange(n), 3).reshape(n, 3)[keep]
    return Layout(
        keep.sum(axis=1),
        owner,
        run_rows[keep],
        cols[owner],
        run_offset[keep],
        col_offset[owner],
        run_count[keep],
        run_rows[keep],  # consecutive shards of a run start `rows` apart
    )
