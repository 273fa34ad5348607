"""The widest-row term: FBGEMM runs every table of a kernel group at the width of the widest.

On each rank TorchRec puts the shards of one module that share a sharding type, a compute kernel
family (fused, fused_uvm and fused_uvm_caching are one), a data type and a pooling into one FBGEMM
table-batched embedding (``group_tables``: without prefetching, whatever their dims), and FBGEMM
sizes that TBE's forward and backward kernels by its widest row (``max_D``): each bag gets a group of
threads as wide as the widest row needs, up to a warp (32 threads x 4 floats: 128 columns; wider rows
loop). A narrow table's ids then keep as many lanes busy as the widest table's, up to 128 columns.
TorchRec's per-shard formulas price each shard at its own width. On one H200 the profile fitted
without this term predicted plans putting 49-column tables beside 241-column ones 25-37% too fast
(bench/RESULTS.md §7).

``Extensions.widest_dim_multiplier`` prices the difference, per shard: its ids (as the cost model
counts them) x (its group's widest columns - its own, both at most 128) x bytes per weight / the
bandwidth of the group's kernel in HBM (fused for the uvm kernels: idle lanes, not reads over the
host link) x the multiplier, forward and backward together. (Uncapped, or in whole 128-column
steps, the same fit predicted the H200's workloads less well: bench/RESULTS.md §7.) It depends on
which shards share a rank, so it is not part of a shard's ``Perf``: the search balances without it,
a plan's predicted time per rank adds it (``rec.analysis.rank_times``), and after the search narrow and
wide tables are tried apart (``rec.passes.split_widths``). At the default 0 it adds nothing.
"""

from __future__ import annotations

import numpy as np

from rec.cost.constants import FULL_BLOCK_EMB_DIM
from rec.sharding import COMPUTE_KERNELS, ComputeKernel

# TorchRec's _get_compute_kernel_type: the uvm kernels share the fused TBE.
KERNEL_FAMILY = {ComputeKernel.DENSE: ComputeKernel.DENSE, ComputeKernel.FUSED: ComputeKernel.FUSED,
                 ComputeKernel.FUSED_UVM: ComputeKernel.FUSED, ComputeKernel.FUSED_UVM_CACHING: ComputeKernel.FUSED,
                 ComputeKernel.KEY_VALUE: ComputeKernel.KEY_VALUE}
FAMILY_CODE = np.array([COMPUTE_KERNELS.index(KERNEL_FAMILY[ck]) for ck in COMPUTE_KERNELS])  # by kernel code


def lanes(cols: np.ndarray) -> np.ndarray:
    """The columns a shard's bag keeps busy in its kernel group: its own, at most a warp's 128."""
    out: np.ndarray = np.minimum(cols, FULL_BLOCK_EMB_DIM)
    return out


def group_extremes(group: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(G,) each: the least and the greatest of ``values`` in each group (``group``: 0..G-1 per shard)."""
    least, greatest = np.full(int(group.max()) + 1, np.inf), np.full(int(group.max()) + 1, -np.inf)
    np.minimum.at(least, group, values)
    np.maximum.at(greatest, group, values)
    return least, greatest


def padding_ms(group: np.ndarray, ids: np.ndarray, cols: np.ndarray, elem: np.ndarray, bw: np.ndarray,
               multiplier: float) -> np.ndarray:
    """ms per shard: ``group`` numbers each shard's kernel group (0..G-1); ``ids`` its ids per
    iteration, ``cols`` its columns, ``elem`` its bytes per weight, ``bw`` its kernel's bytes/ms."""
    if not multiplier or not len(group):
        return np.zeros(len(group))
    own = lanes(cols)
    _, widest = group_extremes(group, own)
    out: np.ndarray = multiplier * ids * (widest[group] - own) * elem / bw
    return out
