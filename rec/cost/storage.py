"""Per-shard HBM/DDR bytes of TorchRec's ``EmbeddingStorageEstimator`` (pipeline_type NONE).

Mirrors ``shard_estimators.calculate_shard_storages`` for training with the default sharder: the
weights (plus optimizer state, plus UVM-cache bookkeeping in HBM when cached) and the shard's
input/output buffers, which count toward HBM on cuda and toward DDR on cpu.
"""

from __future__ import annotations

import math

import numpy as np

from rec.cost.bandwidth import UVM_CACHING_RATIO
from rec.sharding import ComputeDevice, ComputeKernel, ShardingType

INDEX_BYTES = 8  # BIGINT_DTYPE


def shard_storage(
    sharding_type: ShardingType,
    kernel: ComputeKernel,
    device: ComputeDevice,
    world_size: int,
    local_world_size: int,
    caching_ratio: float | None,
    table_rows: np.ndarray,
    table_dims: np.ndarray,
    elem: np.ndarray,
    optimizer_multiplier: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    batch_inputs: np.ndarray,
    batch_outputs: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(hbm, ddr) bytes of every shard (run), int64."""
    # The storage estimator falls back to the default for any falsy ratio (0.0 included).
    cr = caching_ratio if caching_ratio else UVM_CACHING_RATIO
    tensor_bytes = table_rows * table_dims * elem
    zero = np.zeros_like(tensor_bytes)
    # compute_storage_usage (StorageUsageType.BASE): UVM kernels keep weights in DDR.
    if kernel in (ComputeKernel.FUSED_UVM, ComputeKernel.FUSED_UVM_CACHING):
        hbm_base, ddr_base = zero, tensor_bytes
    elif device == ComputeDevice.CUDA:
        hbm_base, ddr_base = tensor_bytes, zero
    else:
        hbm_base, ddr_base = zero, tensor_bytes
    cached = kernel == ComputeKernel.FUSED_UVM_CACHING
    if cached:
        hbm_base = np.rint(ddr_base * cr).astype(np.int64)  # round(): half to even

    dp = sharding_type == ShardingType.DATA_PARALLEL
    shard_elems = rows * cols
    table_elems = table_rows * table_dims
    hbm = _with_optimizer(hbm_base, shard_elems, table_elems, dp, optimizer_multiplier)
    ddr = _with_optimizer(ddr_base, shard_elems, table_elems, dp, optimizer_multiplier)
    if cached:
        # _calculate_cache_aux_state_sizes: 4 B/row index map + 16 B per cached slot.
        hbm = hbm + np.ceil(rows * (4 + cr * 16)).astype(np.int64)

    inputs, outputs = _io_sizes(
        sharding_type, world_size, local_world_size, table_dims, rows, cols, elem,
        batch_inputs, batch_outputs,
    )
    if device == ComputeDevice.CUDA:
        return hbm + inputs + outputs, ddr
    return np.zeros_like(hbm), inputs + outputs + ddr


def _with_optimizer(storage, shard_elems, table_elems, dp: bool, multiplier) -> np.ndarray:
    """``_calculate_tensor_sizes`` + ``_calculate_optimizer_sizes`` for one storage tier."""
    tensor = storage if dp else ceil_true_div(storage, shard_elems, table_elems)
    optimizer = np.ceil(tensor * multiplier).astype(np.int64)
    return tensor + optimizer


def _io_sizes(st, w, lw, dims, rows, cols, elem, bi, bo) -> tuple[np.ndarray, np.ndarray]:
    """``_calculate_shard_io_sizes`` for pooled outputs of the table's element size."""
    if st == ShardingType.DATA_PARALLEL:
        return _ceil(bi * INDEX_BYTES), _ceil(bo * dims * elem)
    if st == ShardingType.TABLE_WISE:
        return _ceil(bi * w * INDEX_BYTES), _ceil(bo * w * dims * elem)
    if st in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        return _ceil(bi * w * INDEX_BYTES), _ceil(bo * w * cols * elem)
    group = w if st == ShardingType.ROW_WISE else lw  # grid_shard sizes its io like TWRW
    nonempty = rows * cols != 0  # empty row shards get no io buffers
    inputs = np.where(nonempty, _ceil(bi / group * w * INDEX_BYTES), 0)
    outputs = np.where(nonempty, _ceil(bo * w * cols * elem), 0)
    return inputs, outputs


def _ceil(x: np.ndarray) -> np.ndarray:
    return np.ceil(x).astype(np.int64)


def ceil_true_div(a: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``math.ceil(a * p / q)`` exactly as CPython computes it for ints (no int64 overflow).

    CPython divides the exact product correctly rounded to a float; ceil() then adds 1 only if
    the remainder survives that rounding. Here a * p / q = quo + rem / q' with p/q reduced, and
    the float keeps the remainder iff rem / q' exceeds half an ulp of quo (ties go to the even
    quo, which it always is below 2**52).
    """
    a, p, q = (np.asarray(x, dtype=np.int64) for x in (a, p, q))
    a, p, q = np.broadcast_arrays(a, p, q)
    g = np.gcd(p, q)
    p, q = p // np.maximum(g, 1), q // np.maximum(g, 1)
    hi, lo = np.divmod(a, q)
    risky = lo.astype(np.float64) * p >= 2.0**62
    t = np.where(risky, 0, lo) * p
    quo = hi * p + t // q
    rem = t % q
    keeps = (rem > 0) & (rem / q > np.spacing(quo.astype(np.float64)) / 2)
    out = quo + keeps
    for i in np.flatnonzero(risky):  # products beyond int64: let Python do it
        out.flat[i] = math.ceil(int(a.flat[i]) * int(p.flat[i]) / int(q.flat[i]))
    return out
