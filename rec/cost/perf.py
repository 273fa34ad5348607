"""Per-shard ``Perf.total`` (ms) of TorchRec's evaluator-based ``EmbeddingPerfEstimator``.

Mirrors ``planner/estimator/estimator.py`` with the default ``EmbeddingPerfEstimatorConfig`` (all
coefficients 1.0, hash-size coefficient 0, backward = 2 x forward) for training, unweighted pooled
(EBC) features, no qcomm codecs (every comm element is the table's element size), 8-byte indices
and no cache statistics, so ``prefetch_compute`` is 0. Float operations follow TorchRec's order so
results agree to the last bit where numpy and Python round alike (the ``1.0 *`` and ``+ 0.0``
terms are TorchRec's unit coefficients, zero hash-size term and zero prefetch).
"""

from __future__ import annotations

import numpy as np

from rec.cost.bandwidth import Collective, comms_bw
from rec.cost.constants import (
    BATCHED_COPY_PERF_FACTOR,
    BWD_COMPUTE_MULTIPLIER,
    DP_ELEMENTWISE_KERNELS_PERF_FACTOR,
    FULL_BLOCK_EMB_DIM,
    HALF_BLOCK_PENALTY,
    INDEX_BYTES,
    QUARTER_BLOCK_PENALTY,
)
from rec.sharding import ShardingType
from rec.topology.types import Topology


def shard_perf(
    sharding_type: ShardingType,
    topology: Topology,
    device_bw: float,
    cols: np.ndarray,
    table_rows: np.ndarray,
    elem: np.ndarray,
    batch_inputs: np.ndarray,
    batch_outputs: np.ndarray,
) -> np.ndarray:
    """``Perf.total`` of every shard (run) given its width and its table's columns."""
    w, lw = topology.world_size, topology.local_world_size
    st = sharding_type
    if st in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        return _table_wise(topology, device_bw, cols, elem, batch_inputs, batch_outputs)
    if st == ShardingType.ROW_WISE:
        return _row_wise(topology, device_bw, cols, elem, batch_inputs, batch_outputs, w, False)
    if st == ShardingType.TABLE_ROW_WISE:
        return _row_wise(topology, device_bw, cols, elem, batch_inputs, batch_outputs, lw, True)
    if st == ShardingType.DATA_PARALLEL:
        return _data_parallel(
            topology, device_bw, cols, table_rows, elem, batch_inputs, batch_outputs
        )
    raise ValueError(f"unsupported sharding type {st}")


def block_usage_penalty(dims: np.ndarray) -> np.ndarray:
    """``compute_block_usage_penalty``: FBGEMM under-uses its 128-wide blocks for narrow shards."""
    return np.where(
        dims < FULL_BLOCK_EMB_DIM,
        np.where(dims >= 64, HALF_BLOCK_PENALTY, QUARTER_BLOCK_PENALTY),
        1.0,
    )


def _table_wise(
    topology: Topology, bw: float, d: np.ndarray, e: np.ndarray, bi: np.ndarray, bo: np.ndarray
) -> np.ndarray:
    """``TableWiseEvaluator`` (also column_wise and table_column_wise)."""
    w = topology.world_size
    input_read = np.ceil(bi * w * INDEX_BYTES)
    lookup = bi * w * np.maximum(d, 32) * e  # use_min_dim_for_lookup
    output = bo * w * d * e
    fwd = (1.0 * input_read + 1.0 * lookup + 1.0 * output + 0.0) * block_usage_penalty(d) / bw
    bwd = fwd * BWD_COMPUTE_MULTIPLIER
    a2a = comms_bw(topology, Collective.ALL_TO_ALL, w, topology.local_world_size)
    fwd_comms = output / a2a
    bwd_comms = output / a2a
    total: np.ndarray = fwd + bwd + fwd_comms + bwd_comms + 0.0
    return total


def _row_wise(
    topology: Topology, bw: float, d: np.ndarray, e: np.ndarray, bi: np.ndarray, bo: np.ndarray,
    group: int, by_host: bool,
) -> np.ndarray:
    """``RowWiseEvaluator`` (group = world) and ``TableRowWiseEvaluator`` (group = host)."""
    w, lw = topology.world_size, topology.local_world_size
    input_read = np.ceil(bi / group * w * INDEX_BYTES)
    lookup = bi / group * w * d * e
    output = bo * w * d * e  # pooled: batch_outputs is not divided by the group
    fwd = (1.0 * input_read + 1.0 * lookup + 1.0 * output + 0.0) * 1.0 / bw
    bwd = fwd * BWD_COMPUTE_MULTIPLIER
    batched_copy = output * BATCHED_COPY_PERF_FACTOR / bw
    if not by_host:
        fwd_comms = output / comms_bw(topology, Collective.REDUCE_SCATTER, w, lw)
        bwd_comms = output / comms_bw(topology, Collective.ALL_GATHER, w, lw) + batched_copy
        total: np.ndarray = fwd + bwd + fwd_comms + bwd_comms + 0.0
        return total
    # Reduce-scatter / all-gather inside the host group, all-to-all across groups.
    intra_fwd = output / comms_bw(topology, Collective.REDUCE_SCATTER, group, min(group, lw))
    intra_bwd = output / comms_bw(topology, Collective.ALL_GATHER, group, min(group, lw))
    groups = max(1, w // group)
    inter = 0.0
    if groups > 1:
        inter = bo * groups * d * e / comms_bw(topology, Collective.ALL_TO_ALL, groups, 1)
    fwd_comms = intra_fwd + inter
    bwd_comms = inter + intra_bwd + batched_copy
    total = fwd + bwd + fwd_comms + bwd_comms + 0.0
    return total


def _data_parallel(
    topology: Topology, bw: float, d: np.ndarray, rows: np.ndarray, e: np.ndarray, bi: np.ndarray,
    bo: np.ndarray,
) -> np.ndarray:
    """``DataParallelEvaluator``: local lookups, gradient all-reduce plus optimizer kernels."""
    w, lw = topology.world_size, topology.local_world_size
    input_read = np.ceil(bi * INDEX_BYTES)
    lookup = bi * d * e
    output = bo * d * e
    fwd = (1.0 * input_read + 1.0 * lookup + 1.0 * output + 0.0) * 1.0 / bw
    bwd = fwd * BWD_COMPUTE_MULTIPLIER
    table_size = rows * d * e
    num_nodes = min(w / lw, 2)
    all_reduce = table_size * (2 * num_nodes - 1) / num_nodes / comms_bw(
        topology, Collective.ALL_REDUCE, w, lw
    )
    if w > 2 * lw:
        all_reduce = all_reduce * 2
    optimizer_kernels = table_size * DP_ELEMENTWISE_KERNELS_PERF_FACTOR / bw
    total: np.ndarray = fwd + bwd + 0 + (all_reduce + optimizer_kernels) + 0.0
    return total
