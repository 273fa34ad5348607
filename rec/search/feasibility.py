"""Explain, per table, why nothing fits, and by how much."""

from __future__ import annotations

import numpy as np

from rec.cost.types import COMPUTE_KERNELS, SHARDING_TYPES
from rec.errors import InputError, Problem, ProblemList
from rec.search.space import SearchSpace
from rec.sharding import ComputeDevice, ComputeKernel, ShardingType
from rec.spec.types import Spec, TableSpec
from rec.topology.types import Topology
from rec.units import format_bytes


def check_capacity_left(space: SearchSpace, topology: Topology) -> None:
    """TorchRec reserves memory for every feature's input batch before any table; when that
    leaves a rank nothing, say so once rather than failing every table."""
    kind, cap = (("HBM", space.hbm_cap) if topology.compute_device is ComputeDevice.CUDA
                 else ("DDR", space.ddr_cap))
    if cap.max() > 0:
        return
    raise InputError("The topology has no memory left for embedding tables:", [Problem(
        "topology", f"after the storage reservation ({topology.storage_reservation:.0%} of HBM) and "
                    f"the input buffers of {space.num_tables:,} tables at batch_size "
                    f"{topology.batch_size} (TorchRec's HeuristicalStorageReservation), each rank "
                    f"has {format_bytes(cap.max())} {kind}; lower batch_size or pooling factors, or use "
                    "ranks with more memory")])


def check_every_table_fits(space: SearchSpace, spec: Spec, device: ComputeDevice) -> None:
    """Raise one InputError naming every table none of whose options fits a rank."""
    opts = space.options
    has = np.zeros(space.num_tables, dtype=bool)
    has[opts.table[space.feasible]] = True
    if has.all():
        return
    problems = ProblemList()
    shard_max_hbm = opts.largest(opts.hbm)
    shard_max_ddr = opts.largest(opts.ddr)
    hbm_cap, ddr_cap = int(space.hbm_cap.max()), int(space.ddr_cap.max())
    for t in np.flatnonzero(~has):
        mine = np.flatnonzero(opts.table == t)
        if not len(mine):
            problems.add(f"table {spec.tables[t].key}",
                         "no sharding option is allowed on this topology "
                         "(check sharding_types / compute_kernels against the compute device)")
            continue
        over = np.maximum(shard_max_hbm[mine] - hbm_cap, shard_max_ddr[mine] - ddr_cap)
        o = mine[int(np.argmin(over))]
        st = SHARDING_TYPES[opts.sharding_type[o]].value
        ck = COMPUTE_KERNELS[opts.compute_kernel[o]].value
        kind, need, cap = (("HBM", shard_max_hbm[o], hbm_cap) if shard_max_hbm[o] > hbm_cap
                           else ("DDR", shard_max_ddr[o], ddr_cap))
        problems.add(f"table {spec.tables[t].key}",
                     f"does not fit: its best option ({st}/{ck}) needs {format_bytes(need)} {kind} on one "
                     f"rank, {format_bytes(cap)} available (over by {format_bytes(need - cap)}); "
                     + _hint(space, spec.tables[t], mine, device))
    problems.raise_if_any("The spec does not fit the topology:")


def _hint(space: SearchSpace, table: TableSpec, mine: np.ndarray, device: ComputeDevice) -> str:
    """What would make the table fit: options its allow-lists exclude, and how many ranks."""
    opts = space.options
    hbm_cap, ddr_cap = max(int(space.hbm_cap.max()), 1), max(int(space.ddr_cap.max()), 1)

    def ranks_needed(o: int) -> int:
        sl = opts.shards(o)
        hbm = float((opts.hbm[sl] * opts.repeat[sl]).sum())
        ddr = float((opts.ddr[sl] * opts.repeat[sl]).sum())
        return int(np.ceil(max(hbm / hbm_cap, ddr / ddr_cap)))

    ranks = min(ranks_needed(o) for o in mine)
    helps = []
    if device is ComputeDevice.CUDA:
        if table.compute_kernels and ComputeKernel.FUSED_UVM_CACHING not in table.compute_kernels:
            helps.append("allow the fused_uvm_caching kernel")
        if table.sharding_types and ShardingType.ROW_WISE not in table.sharding_types:
            helps.append("allow row_wise sharding")
    elif table.sharding_types and ShardingType.COLUMN_WISE not in table.sharding_types:
        helps.append("allow column_wise sharding")
    helps.append(f"use at least {max(ranks, space.world_size + 1)} ranks of this size")
    return " or ".join(helps)


def packing_failure(space: SearchSpace, spec: Spec, tables: list[int]) -> InputError:
    """The error for tables that fit one by one but not together."""
    names = ", ".join(spec.tables[t].key for t in tables[:10])
    more = f" and {len(tables) - 10} more" if len(tables) > 10 else ""
    return InputError(
        "The tables fit one by one but not all together within the ranks' memory:",
        [Problem(f"tables {names}{more}",
                 f"could not be placed; usable HBM {format_bytes(space.hbm_cap.sum())} and DDR "
                 f"{format_bytes(space.ddr_cap.sum())} over all ranks; allow fused_uvm_caching kernels, "
                 "lower storage_reservation or add ranks")],
    )
