"""The HBM a plan's caches take on the GPU, as FBGEMM builds them.

TorchRec builds one FBGEMM table-batched embedding per kernel group on a rank (``rec.cost.widest``)
and gives its fused_uvm_caching tables one cache between them: the group's rows times their load
factors averaged by rows (``_get_weighted_avg_cache_load_factor``), in sets of 32 rows, each row as
wide as the group's widest cached table (FBGEMM's ``max_D_cache``). TorchRec's estimator, and the
cost model that follows it, count each table's cache at its own width: a narrow table cached beside
a wide one takes more HBM than its plan counted (read from TorchRec 1.6.1 and FBGEMM 1.6.0, the
same in TorchRec 1.8; docs/gpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rec.analysis.rank_times import kernel_groups, spec_positions
from rec.cost.tables import table_arrays
from rec.plan.load_factors import chosen_load_factors
from rec.plan.types import Plan
from rec.sharding import CK_CODE, ComputeKernel

CACHE_ASSOCIATIVITY = 32  # FBGEMM's DEFAULT_ASSOC: rows per cache set


@dataclass(frozen=True)
class CacheHbm:
    planned: np.ndarray  # (W,) bytes: each rank's caches, each at its own width, as the plan counts them
    built: np.ndarray  # (W,) bytes: the same caches as FBGEMM builds them

    @property
    def extra(self) -> np.ndarray:
        """(W,) bytes the caches take beyond what the plan counted."""
        out: np.ndarray = np.maximum(self.built - self.planned, 0)
        return out


def cache_hbm(plan: Plan) -> CacheHbm:
    """Each rank's fused_uvm_caching caches, as planned and as FBGEMM builds them."""
    c = plan.columns
    world = plan.world_size
    caching = c.compute_kernel[c.table_of_entry] == CK_CODE[ComputeKernel.FUSED_UVM_CACHING]
    if not caching.any():
        return CacheHbm(np.zeros(world), np.zeros(world))
    arrays = table_arrays(plan.spec, plan.topology.batch_size, plan.planner.cost, chosen_load_factors(plan),
                          world_size=world)
    t = spec_positions(plan)[c.table_of_entry]
    group = kernel_groups(plan, arrays.elem[t], arrays.pooled[t])[caching]
    rows, cols = c.rows[caching].astype(np.float64), c.cols[caching].astype(np.float64)
    elem, factor = arrays.elem[t][caching].astype(np.float64), arrays.load_factor[t][caching]
    rank = c.rank[caching]
    planned = np.bincount(rank, weights=factor * rows * cols * elem, minlength=world)
    groups = int(group.max()) + 1
    cached_rows = np.bincount(group, weights=factor * rows, minlength=groups)  # average load factor x rows
    widest = np.zeros(groups)
    np.maximum.at(widest, group, cols * elem)
    sets = np.maximum(1, np.ceil(np.floor(cached_rows) / CACHE_ASSOCIATIVITY))
    group_rank = np.zeros(groups, np.int64)
    group_rank[group] = rank
    built = np.bincount(group_rank, weights=sets * CACHE_ASSOCIATIVITY * widest, minlength=world)
    return CacheHbm(planned, built)
