"""Kernel and collective bandwidths in bytes/ms, looked up as TorchRec's planner does."""

from __future__ import annotations

from enum import Enum

from rec.cost.constants import HBM_TO_DDR_MEM_BW, UVM_CACHING_RATIO
from rec.sharding import ComputeDevice, ComputeKernel
from rec.topology.types import Topology


class Collective(Enum):
    ALL_TO_ALL = "all_to_all"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"


def kernel_bw(topology: Topology, kernel: ComputeKernel, caching_ratio: float | None) -> float:
    """``constants.kernel_bw_lookup`` without a prefetch pipeline (the sharder default)."""
    cr = caching_ratio if caching_ratio is not None else UVM_CACHING_RATIO
    hbm, ddr = topology.hbm_mem_bw, topology.ddr_mem_bw
    if topology.compute_device == ComputeDevice.CPU:
        table = {ComputeKernel.DENSE: 0.5 * ddr, ComputeKernel.FUSED: 1 * ddr}
    else:
        table = {
            ComputeKernel.DENSE: 0.5 * hbm,
            ComputeKernel.FUSED: 1 * hbm,
            ComputeKernel.FUSED_UVM: HBM_TO_DDR_MEM_BW / 10,
            ComputeKernel.FUSED_UVM_CACHING: (cr * hbm + (1 - cr) * HBM_TO_DDR_MEM_BW) / 10,
        }
    if kernel not in table:
        device = topology.compute_device.value
        raise ValueError(f"no kernel bandwidth for {kernel.value} on {device}")
    return table[kernel]


def comms_bw(
    topology: Topology, collective: Collective, world_size: int, local_world_size: int
) -> float:
    """``BasicCommsBandwidths.get_bw`` for a collective over ``world_size`` ranks."""
    if collective == Collective.ALL_REDUCE:
        return topology.inter_host_bw * local_world_size  # one NIC per GPU
    if world_size <= local_world_size:
        return topology.intra_host_bw
    return topology.inter_host_bw
