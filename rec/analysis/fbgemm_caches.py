"""The HBM a plan's caches take on the GPU, as FBGEMM builds them.

TorchRec builds one FBGEMM table-batched embedding per kernel group on a rank (``rec.cost.widest``)
and gives its fused_uvm_caching tables one cache between them: the group's rows times their load
factors averaged by rows (``_get_weighted_avg_cache_load_factor``), in sets of 32 rows, each row as
wide as the group's widest cached table (FBGEMM's ``max_D_cache``). TorchRec's estimator, and the
cost model that follows it, count each table's cache at its own width: a narrow table cached beside
a wide one takes more HBM than its plan counted (read from TorchRec 1.6.1 and FBGEMM 1.6.0, the
same in TorchRec 1.8; docs/gpu.md). The optimizer's state sits elsewhere than TorchRec counts it
too (FBGEMM's ``construct_split_state``): a rowwise optimizer keeps one float32 per row of a uvm
table in HBM, every row, and a full one (Adam, Adagrad) keeps a cached table's in host memory, where
TorchRec counts the load factor's share of either in HBM (none of a fused_uvm table's). A cache the
plan gives no size (TorchRec's default, beside sizes a user stated) gets the mean of the sizes its
group's tables state. Assumed: no prefetch pipeline (with one, TorchRec puts cached tables of other
widths in TBEs of their own: nothing is widened).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rec.analysis.rank_times import kernel_groups, spec_positions
from rec.config.cost import UVM_CACHING_RATIO, Optimizer
from rec.cost.tables import table_arrays, table_optimizer
from rec.plan.load_factors import chosen_load_factors, unstated_caches
from rec.plan.types import Plan
from rec.sharding import CK_CODE, ComputeKernel

CACHE_ASSOCIATIVITY = 32  # FBGEMM's DEFAULT_ASSOC: rows per cache set
ROWWISE_STATE_BYTES = 4  # a rowwise optimizer's momentum: one float32 per row
SLOT_STATE_BYTES = 16  # per cache slot: lxu_cache_state and (LRU) lxu_state, an int64 each
INDEX_MAP_BYTES = 4  # per row of a group's cached tables: cache_index_table_map, an int32


@dataclass(frozen=True)
class CacheHbm:
    """Per rank, the HBM of its uvm tables' caches and optimizer state."""

    planned: np.ndarray  # (W,) bytes: as the plan (TorchRec's estimator) counts it
    built: np.ndarray  # (W,) bytes: as FBGEMM builds it

    @property
    def extra(self) -> np.ndarray:
        """(W,) bytes the caches take beyond what the plan counted."""
        out: np.ndarray = np.maximum(self.built - self.planned, 0)
        return out


def cache_hbm(plan: Plan) -> CacheHbm:
    """Each rank's fused_uvm_caching caches and uvm tables' optimizer state in HBM, as planned and as
    FBGEMM builds them."""
    c = plan.columns
    world = plan.world_size
    kernel = c.compute_kernel[c.table_of_entry]
    caching = kernel == CK_CODE[ComputeKernel.FUSED_UVM_CACHING]
    t = spec_positions(plan)[c.table_of_entry]
    rowwise = np.fromiter((table_optimizer(table, plan.planner.cost) is Optimizer.ROWWISE_ADAGRAD
                           for table in plan.spec.tables), bool, len(plan.spec.tables))[t]
    # A fused_uvm table's weights and state are in host memory as TorchRec counts them; a rowwise state is not.
    uvm = (kernel == CK_CODE[ComputeKernel.FUSED_UVM]) & rowwise
    uvm_state = np.bincount(c.rank[uvm], weights=c.rows[uvm] * ROWWISE_STATE_BYTES, minlength=world)
    if not caching.any():
        return CacheHbm(np.zeros(world), uvm_state)
    arrays = table_arrays(plan.spec, plan.topology.batch_size, plan.planner.cost, chosen_load_factors(plan),
                          world_size=world, unstated=unstated_caches(plan))
    group = kernel_groups(plan)[caching]
    rows, cols = c.rows[caching].astype(np.float64), c.cols[caching].astype(np.float64)
    elem, factor = arrays.elem[t][caching].astype(np.float64), arrays.load_factor[t][caching]
    multiplier = arrays.optimizer_multiplier[t][caching]
    rank = c.rank[caching]
    planned = np.bincount(rank, weights=factor * rows * cols * elem * (1 + multiplier), minlength=world)
    state = rows * ROWWISE_STATE_BYTES * rowwise[caching]  # a full optimizer's: host memory
    groups = int(group.max()) + 1
    # TorchRec averages the sizes the group's tables state, weighted by their rows; an unstated cache
    # (TorchRec's default size, rec.cost.tables.implicit_caches) gets that mean, or FBGEMM's default.
    stated = ~unstated_caches(plan)[t][caching]
    stated_rows = np.bincount(group, weights=rows * stated, minlength=groups)
    mean = np.where(stated_rows > 0, np.bincount(group, weights=factor * rows * stated, minlength=groups)
                    / np.maximum(stated_rows, 1), UVM_CACHING_RATIO)
    group_rows = np.bincount(group, weights=rows, minlength=groups)
    cached_rows = np.floor(mean * group_rows)
    widest = np.zeros(groups)
    np.maximum.at(widest, group, cols * elem)
    # FBGEMM builds at least one set for a group with rows (none without), and beside each slot's row
    # its LRU state and the slot's key (int64 each), and an int32 per row of the group's tables
    # (cache_index_table_map): FBGEMM 1.6-1.8 _apply_cache_state.
    sets = np.where(group_rows >= 1, np.maximum(1, np.ceil(cached_rows / CACHE_ASSOCIATIVITY)), 0)
    group_rank = np.zeros(groups, np.int64)
    group_rank[group] = rank
    per_group = sets * CACHE_ASSOCIATIVITY * (widest + SLOT_STATE_BYTES) + group_rows * INDEX_MAP_BYTES
    built = (np.bincount(group_rank, weights=per_group, minlength=world)
             + np.bincount(rank, weights=state, minlength=world) + uvm_state)
    return CacheHbm(planned, built)
