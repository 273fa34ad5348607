"""Per-shard HBM/DDR bytes of TorchRec's ``EmbeddingStorageEstimator`` (pipeline_type NONE).

Mirrors ``shard_estimators.calculate_shard_storages`` for training with the default sharder: the
weights (plus optimizer state, plus UVM-cache bookkeeping in HBM when cached) and the shard's
input/output buffers, which count toward HBM on cuda and toward DDR on cpu. An unpooled table's
(an EmbeddingCollection's) output buffer holds one vector per id (``is_pooled=False``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rec.config.cost import UVM_CACHING_RATIO
from rec.cost.constants import INDEX_BYTES
from rec.sharding import ComputeDevice, ComputeKernel, ShardingType


@dataclass(frozen=True)
class StorageParts:
    """Per-run byte counts shared by every kernel of one sharding type."""

    weights: np.ndarray  # the shard's share of the weights, plus optimizer state
    cached: np.ndarray  # HBM of a fused_uvm_caching shard: cache share, optimizer, aux state
    io: np.ndarray  # input + output buffers


def storage_parts(
    sharding_type: ShardingType,
    world_size: int,
    local_world_size: int,
    caching_ratio: float | np.ndarray | None,
    table_rows: np.ndarray,
    table_dims: np.ndarray,
    elem: np.ndarray,
    optimizer_multiplier: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    batch_inputs: np.ndarray,
    batch_outputs: np.ndarray,
    with_cache: bool,
    pooled: np.ndarray | None = None,
) -> StorageParts:
    """Weights, cached-weights and io bytes of every shard (run); ``pooled`` (default: all) says which
    tables' outputs are pooled (unpooled tables' ``batch_outputs`` are their ``batch_inputs``)."""
    dp = sharding_type == ShardingType.DATA_PARALLEL
    shard_elems = rows * cols
    table_elems = table_rows * table_dims
    tensor_bytes = table_elems * elem  # get_tensor_size_bytes
    weights = _with_optimizer(tensor_bytes, shard_elems, table_elems, dp, optimizer_multiplier)
    cached = weights[:0]
    if with_cache:
        # The storage estimator falls back to the default for any falsy ratio (0.0 included).
        given = np.asarray(UVM_CACHING_RATIO if caching_ratio is None else caching_ratio, dtype=np.float64)
        cr = np.where(given != 0, given, UVM_CACHING_RATIO)
        cache_bytes = np.rint(tensor_bytes * cr).astype(np.int64)  # round(): half to even
        cached = _with_optimizer(cache_bytes, shard_elems, table_elems, dp, optimizer_multiplier)
        # _calculate_cache_aux_state_sizes: 4 B/row index map + 16 B per cached slot.
        cached = cached + np.ceil(rows * (4 + cr * 16)).astype(np.int64)
    inputs, outputs = _io_sizes(
        sharding_type, world_size, local_world_size, table_dims, rows, cols, elem,
        batch_inputs, batch_outputs, pooled,
    )
    return StorageParts(weights, cached, inputs + outputs)


def kernel_storage(
    parts: StorageParts, kernel: ComputeKernel, device: ComputeDevice
) -> tuple[np.ndarray, np.ndarray]:
    """(hbm, ddr) bytes per run: where ``compute_storage_usage`` puts the weights, plus io."""
    if device == ComputeDevice.CPU:
        return np.zeros_like(parts.io), parts.io + parts.weights  # io counts toward DDR on cpu
    if kernel == ComputeKernel.FUSED_UVM:
        return parts.io, parts.weights  # weights (and their optimizer state) live in DDR
    if kernel == ComputeKernel.FUSED_UVM_CACHING:
        return parts.cached + parts.io, parts.weights
    return parts.weights + parts.io, np.zeros_like(parts.io)


def _with_optimizer(
    storage: np.ndarray, shard_elems: np.ndarray, table_elems: np.ndarray, dp: bool, multiplier: np.ndarray
) -> np.ndarray:
    """``_calculate_tensor_sizes`` + ``_calculate_optimizer_sizes`` for one storage tier."""
    tensor = storage if dp else ceil_true_div(storage, shard_elems, table_elems)
    optimizer = np.ceil(tensor * multiplier).astype(np.int64)
    total: np.ndarray = tensor + optimizer
    return total


def _io_sizes(
    st: ShardingType, w: int, lw: int, dims: np.ndarray, rows: np.ndarray, cols: np.ndarray,
    elem: np.ndarray, bi: np.ndarray, bo: np.ndarray, pooled: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``_calculate_shard_io_sizes`` for outputs of the table's element size."""
    if st == ShardingType.DATA_PARALLEL:
        return _ceil(bi * INDEX_BYTES), _ceil(bo * dims * elem)
    if st == ShardingType.TABLE_WISE:
        return _ceil(bi * w * INDEX_BYTES), _ceil(bo * w * dims * elem)
    if st in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        return _ceil(bi * w * INDEX_BYTES), _ceil(bo * w * cols * elem)
    group = w if st == ShardingType.ROW_WISE else lw
    nonempty = rows * cols != 0  # empty row shards get no io buffers
    inputs = np.where(nonempty, _ceil(bi / group * w * INDEX_BYTES), 0)
    per_rank = bo if pooled is None else np.where(pooled, bo, bo / group)  # unpooled: a share of the ids
    outputs = np.where(nonempty, _ceil(per_rank * w * cols * elem), 0)
    return inputs, outputs


def _ceil(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.ceil(x).astype(np.int64)
    return out


def ceil_true_div(a: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``math.ceil(a * p / q)`` exactly as CPython computes it for ints (no int64 overflow).

    CPython divides the exact product correctly rounded to a float; ceil() then adds 1 only if
    the remainder survives that rounding. Here a * p / q = quo + rem / q' with p/q reduced, and
    the float keeps the remainder iff rem / q' exceeds half an ulp of quo (ties go to the even
    quo, which it always is below 2**52).
    """
    a, p, q = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (a, p, q)))
    out = np.where(p == q, a, 0)  # whole tables: the quotient is exact
    sub = np.flatnonzero((p != q) & (p != 0) & (a != 0))
    if not len(sub):
        return out
    a, p, q = a.flat[sub], p.flat[sub], q.flat[sub]
    g = np.gcd(p, q)
    p, q = p // g, q // g
    hi, lo = np.divmod(a, q)
    risky = lo.astype(np.float64) * p >= 2.0**62
    t = np.where(risky, 0, lo) * p
    quo = hi * p + t // q
    rem = t % q
    keeps = (rem > 0) & (rem / q > np.spacing(quo.astype(np.float64)) / 2)
    part = quo + keeps
    for i in np.flatnonzero(risky):  # products beyond int64: let Python do it
        part[i] = math.ceil(int(a[i]) * int(p[i]) / int(q[i]))
    out.flat[sub] = part
    return out
