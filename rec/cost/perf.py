"""Per-shard ``Perf`` (ms) of TorchRec's evaluator-based ``EmbeddingPerfEstimator``.

Mirrors ``planner/estimator/estimator.py`` under a ``HardwarePerfConfig`` given by a profile
(``rec.profile``; ``Profile()`` is TorchRec's default ``EmbeddingPerfEstimatorConfig``: all
coefficients 1.0, hash-size coefficient 0, backward = 2 x forward) for training, unweighted and
weighted (``is_weighted``: ids and their weights are read, and backward adds the weights' gradient
kernel) features of pooled (EmbeddingBagCollection) and unpooled (EmbeddingCollection,
``is_pooled=False``) tables, no qcomm codecs (every comm element is the table's element size) and 8-byte indices.
``prefetch_compute`` is TorchRec's for a table with cache statistics (``CacheParams.stats``: the rows
its cache fetches, over the host link) and 0 for one without; a profile's ``cache_miss_multiplier``
puts its own price of fetching a cache's misses there instead. Float operations follow TorchRec's order so
results agree to the last bit where numpy and Python round alike; the profile's extensions
(``fixed_ms``, collective latencies) are added as separate terms, so at their default 0 they change
no bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rec.cost.bandwidth import Collective, Links, comms_ms
from rec.cost.constants import FULL_BLOCK_EMB_DIM, HALF_BLOCK_PENALTY, INDEX_BYTES, QUARTER_BLOCK_PENALTY
from rec.profile.types import PerfCoefficient, Profile
from rec.sharding import ComputeKernel, ShardingType
from rec.topology.types import Topology


@dataclass(frozen=True)
class ShardPerf:
    """TorchRec's ``Perf`` of every shard (run), ms; ``input_dist_comms`` is left out, as from ``total``."""

    fwd_compute: np.ndarray
    fwd_comms: np.ndarray
    bwd_compute: np.ndarray
    bwd_comms: np.ndarray
    prefetch_compute: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """``Perf.total``, summed in TorchRec's order."""
        total: np.ndarray = (self.fwd_compute + self.bwd_compute + self.fwd_comms + self.bwd_comms
                             + self.prefetch_compute)
        return total


@dataclass(frozen=True)
class _Sizes:
    """Byte counts of one sharding type's lookups (``EmbeddingShardingPerfEvaluator._get_*_size``)."""

    input_read: np.ndarray
    lookup_fwd: np.ndarray
    lookup_bwd: np.ndarray  # table_wise reads max(dim, 32) columns forward, dim backward
    output: np.ndarray
    penalty: np.ndarray | float  # block usage penalty, forward only


def shard_perf(
    sharding_type: ShardingType,
    kernel: ComputeKernel,
    topology: Topology,
    profile: Profile,
    hw: Links,
    device_bw: float,
    rows: np.ndarray,
    cols: np.ndarray,
    elem: np.ndarray,
    batch_inputs: np.ndarray,
    batch_outputs: np.ndarray,
    pooled: np.ndarray | None = None,
    miss_rate: np.ndarray | None = None,
    cache_fetches: np.ndarray | None = None,
    weighted: np.ndarray | None = None,
) -> ShardPerf:
    """``Perf`` of every shard (run) given its size (``rows`` x ``cols``) and its table's columns;
    ``pooled`` (default: all) says which tables' outputs are pooled; ``miss_rate`` (a profile's
    ``cache_miss_multiplier`` reads it) the share of a fused_uvm_caching shard's lookups its cache
    misses; ``cache_fetches`` (``rec.cost.tables``; None or 0: no statistics) the rows its table's
    cache fetches per global batch, as TorchRec's estimator reads them from ``CacheStatistics``;
    ``weighted`` (None: none) which tables' features carry weights (an ``is_weighted`` module)."""
    w, lw = topology.world_size, topology.local_world_size
    st, d, e, bi, bo = sharding_type, cols, elem, batch_inputs, batch_outputs
    if st in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        output = bo * w * d * e
        sizes = _Sizes(np.ceil(bi * w * INDEX_BYTES), bi * w * np.maximum(d, 32) * e, bi * w * d * e, output,
                       block_usage_penalty(d))
    elif st in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        group = w if st == ShardingType.ROW_WISE else lw
        lookup = bi / group * w * d * e
        output = bo * w * d * e  # pooled: batch_outputs is not divided by the group
        if pooled is not None and not pooled.all():  # unpooled: each rank outputs its share of the ids
            output = np.where(pooled, output, bo / group * w * d * e)
        sizes = _Sizes(np.ceil(bi / group * w * INDEX_BYTES), lookup, lookup, output, 1.0)
    elif st == ShardingType.DATA_PARALLEL:
        lookup = bi * d * e
        sizes = _Sizes(np.ceil(bi * INDEX_BYTES), lookup, lookup, bo * d * e, 1.0)
    else:
        raise ValueError(f"unsupported sharding type {st}")

    if weighted is not None and not weighted.any():
        weighted = None
    if weighted is not None:  # the weights are read beside the ids
        sizes = replace(sizes, input_read=np.where(weighted, sizes.input_read * 2, sizes.input_read))
    coefficients = profile.coefficients.of(st, kernel)
    fwd = _compute(coefficients.fwd, sizes.input_read, sizes.lookup_fwd, sizes.output, rows, sizes.penalty,
                   device_bw)
    if coefficients.bwd is None:
        fwd = _add_unique(fwd, coefficients.fwd, st, w, lw, bi, rows, d, e, device_bw)
        bwd = fwd * profile.coefficients.bwd_compute_multiplier
    else:
        bwd = _compute(coefficients.bwd, sizes.input_read, sizes.lookup_bwd, sizes.output, rows, None, device_bw)
        fwd = _add_unique(fwd, coefficients.fwd, st, w, lw, bi, rows, d, e, device_bw)
        bwd = _add_unique(bwd, coefficients.bwd, st, w, lw, bi, rows, d, e, device_bw)
    if weighted is not None:
        bwd = _weighted_bwd(bwd, fwd, weighted, profile)

    x = profile.extensions
    fwd_comms: np.ndarray | float
    bwd_comms: np.ndarray
    if st == ShardingType.DATA_PARALLEL:
        fwd_comms, bwd_comms = _data_parallel_comms(hw, w, lw, rows, d, e, device_bw, x.dp_optimizer_factor)
    elif st == ShardingType.ROW_WISE:
        batched_copy = sizes.output * x.batched_copy_factor / device_bw
        fwd_comms = comms_ms(hw, Collective.REDUCE_SCATTER, sizes.output, w, lw)
        bwd_comms = comms_ms(hw, Collective.ALL_GATHER, sizes.output, w, lw) + batched_copy
    elif st == ShardingType.TABLE_ROW_WISE:
        fwd_comms, bwd_comms = _table_row_wise_comms(hw, w, lw, sizes.output, bo, d, e, device_bw,
                                                     x.batched_copy_factor)
    else:
        fwd_comms = comms_ms(hw, Collective.ALL_TO_ALL, sizes.output, w, lw)
        bwd_comms = comms_ms(hw, Collective.ALL_TO_ALL, sizes.output, w, lw)
    zeros = np.zeros(len(rows))
    prefetch = zeros
    if kernel is ComputeKernel.FUSED_UVM_CACHING and x.cache_miss_multiplier and miss_rate is not None:
        # The misses' rows come over the host link before the lookups (FBGEMM's prefetch), at fused_uvm's bandwidth.
        from rec.cost.bandwidth import kernel_bw

        miss_bw = kernel_bw(hw, profile, ComputeKernel.FUSED_UVM, None)
        prefetch = x.cache_miss_multiplier * miss_rate * sizes.lookup_fwd / miss_bw + zeros
    elif kernel is ComputeKernel.FUSED_UVM_CACHING and cache_fetches is not None:
        # TorchRec's _default_prefetch_comp: a row_wise shard fetches its share of the rows.
        divisor = w if st == ShardingType.ROW_WISE else lw if st == ShardingType.TABLE_ROW_WISE else 1
        prefetch = cache_fetches / divisor * d * e / hw.hbm_to_ddr + zeros
    return ShardPerf(fwd, fwd_comms + zeros, bwd, bwd_comms + zeros, prefetch)


def _weighted_bwd(bwd: np.ndarray, fwd: np.ndarray, weighted: np.ndarray, profile: Profile) -> np.ndarray:
    """``compute_bwd_comp`` of weighted tables: the weighted-feature multiplier, then the weights'
    gradient kernel (``weighted_kernel_multiplier`` x forward), in TorchRec's order."""
    c = profile.coefficients
    kernel = fwd * c.weighted_kernel_multiplier
    out: np.ndarray = np.where(weighted, bwd * c.weighted_feature_bwd_compute_multiplier + kernel, bwd)
    return out


def block_usage_penalty(dims: np.ndarray) -> np.ndarray:
    """``compute_block_usage_penalty``: FBGEMM under-uses its 128-wide blocks for narrow shards."""
    return np.where(
        dims < FULL_BLOCK_EMB_DIM,
        np.where(dims >= 64, HALF_BLOCK_PENALTY, QUARTER_BLOCK_PENALTY),
        1.0,
    )


def _compute(c: PerfCoefficient, input_read: np.ndarray, lookup: np.ndarray, output: np.ndarray,
             rows: np.ndarray, penalty: np.ndarray | float | None, bw: float) -> np.ndarray:
    """``_default_fwd_comp`` (with the penalty) or the coefficient branch of ``_default_bwd_comp``
    (without), plus the profile's ``fixed_ms``."""
    size = (c.input_read_size_multiplier * input_read + c.lookup_size_multiplier * lookup
            + c.embedding_output_multiplier * output + c.hash_size_multiplier * rows)
    time: np.ndarray = (size / bw if penalty is None else size * penalty / bw) + c.fixed_ms
    return time


def _add_unique(time: np.ndarray, c: PerfCoefficient, st: ShardingType, w: int, lw: int, bi: np.ndarray,
                rows: np.ndarray, d: np.ndarray, e: np.ndarray, bw: float) -> np.ndarray:
    """``time`` plus the profile's distinct-row terms (an extension, ``rec.cost.unique``): the
    shard's ids as the sizes above count them (all ranks' for table_wise-like, a share of them
    row-wise, the local batch data-parallel), the distinct rows they hit. Nothing at their default 0."""
    if not (c.unique_read_size_multiplier or c.unique_lookup_size_multiplier):
        return time
    from rec.cost.unique import expected_distinct

    distinct = expected_distinct(shard_ids(st, w, lw, bi), rows)
    extra: np.ndarray = time + (c.unique_read_size_multiplier * distinct * INDEX_BYTES
                                + c.unique_lookup_size_multiplier * distinct * d * e) / bw
    return extra


def shard_ids(st: ShardingType, w: int, lw: int, batch_inputs: np.ndarray) -> np.ndarray:
    """Ids per iteration a shard of ``st`` looks up, as the sizes above count them: every rank's
    batch for table_wise-like shards, a share of them row-wise, the local batch data-parallel."""
    if st in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        ids: np.ndarray = batch_inputs / (w if st == ShardingType.ROW_WISE else lw) * w
        return ids
    return batch_inputs if st == ShardingType.DATA_PARALLEL else batch_inputs * w


def _table_row_wise_comms(hw: Links, w: int, lw: int, output: np.ndarray, bo: np.ndarray, d: np.ndarray,
                          e: np.ndarray, bw: float, copy_factor: float) -> tuple[np.ndarray, np.ndarray]:
    """``TableRowWiseEvaluator``: reduce-scatter / all-gather inside the host group, all-to-all across
    groups (the group is a host: shardflow's topology has no pods)."""
    group = lw
    intra_fwd = comms_ms(hw, Collective.REDUCE_SCATTER, output, group, min(group, lw))
    intra_bwd = comms_ms(hw, Collective.ALL_GATHER, output, group, min(group, lw))
    groups = max(1, w // group)
    inter: np.ndarray | float = 0.0
    if groups > 1:
        inter = comms_ms(hw, Collective.ALL_TO_ALL, bo * groups * d * e, groups, 1)
    batched_copy = output * copy_factor / bw
    return intra_fwd + inter, inter + intra_bwd + batched_copy


def _data_parallel_comms(hw: Links, w: int, lw: int, rows: np.ndarray, d: np.ndarray, e: np.ndarray,
                         bw: float, optimizer_factor: float) -> tuple[float, np.ndarray]:
    """``DataParallelEvaluator``: no forward comms; the gradient all-reduce plus optimizer kernels."""
    table_size = rows * d * e
    num_nodes = min(w / lw, 2)
    all_reduce = comms_ms(hw, Collective.ALL_REDUCE, table_size * (2 * num_nodes - 1) / num_nodes, w, lw)
    if w > 2 * lw:
        all_reduce = all_reduce * 2
    optimizer_kernels = table_size * optimizer_factor / bw
    return 0, all_reduce + optimizer_kernels
