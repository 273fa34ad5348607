"""Kernel and collective bandwidths in bytes/ms, looked up as TorchRec's planner does.

A profile (``rec.profile``) may set any bandwidth; where it sets none the topology's applies, as
TorchRec reads bandwidths from its ``Topology``. Collectives also take the profile's per-link
latency (an extension; 0 by default, so the time is TorchRec's bytes / bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from rec.config.cost import UVM_CACHING_RATIO
from rec.cost.constants import HBM_TO_DDR_MEM_BW
from rec.profile.types import Profile
from rec.sharding import ComputeDevice, ComputeKernel
from rec.topology.types import Topology
from rec.topology.validate import MS_PER_S


class Collective(Enum):
    ALL_TO_ALL = "all_to_all"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"


@dataclass(frozen=True)
class Links:
    """What the estimators read of the hardware: bandwidths in bytes/ms, latencies in ms."""

    device: ComputeDevice
    hbm: float
    ddr: float
    hbm_to_ddr: float
    intra_host: float
    inter_host: float
    intra_host_latency_ms: float = 0.0
    inter_host_latency_ms: float = 0.0


def links(topology: Topology, profile: Profile) -> Links:
    """The topology's bandwidths with the profile's where it sets them (bytes/s -> bytes/ms)."""
    b = profile.bandwidths

    def pick(per_second: float | None, default: float) -> float:
        return default if per_second is None else per_second / MS_PER_S  # as topology_from_dict

    return Links(
        device=topology.compute_device,
        hbm=pick(b.hbm_mem_bw, topology.hbm_mem_bw),
        ddr=pick(b.ddr_mem_bw, topology.ddr_mem_bw),
        hbm_to_ddr=pick(b.hbm_to_ddr_mem_bw, HBM_TO_DDR_MEM_BW),
        intra_host=pick(b.intra_host_bw, topology.intra_host_bw),
        inter_host=pick(b.inter_host_bw, topology.inter_host_bw),
        intra_host_latency_ms=profile.extensions.intra_host_latency_ms,
        inter_host_latency_ms=profile.extensions.inter_host_latency_ms,
    )


def kernel_bw(hw: Links, profile: Profile, kernel: ComputeKernel, caching_ratio: float | np.ndarray | None) -> Any:
    """``HardwarePerfConfig.get_device_bw`` without a prefetch pipeline (the sharder default): the
    profile's kernel bandwidth, else ``constants.kernel_bw_lookup``; per shard (an array) where the
    caching ratio is one per shard.

    Under a profile with ``cache_miss_multiplier`` (an extension; 0, TorchRec's rule linear in the
    cache's size, by default) a fused_uvm_caching shard looks every id up in its cache, at the fused
    kernel's bandwidth; fetching its misses is a term of its own (``rec.cost.perf``)."""
    if (kernel is ComputeKernel.FUSED_UVM_CACHING and profile.extensions.cache_miss_multiplier
            and hw.device is ComputeDevice.CUDA):
        return kernel_bw(hw, profile, ComputeKernel.FUSED, None)
    override = profile.kernel_bandwidths.of(kernel)
    if override is not None:
        return override / MS_PER_S
    cr = caching_ratio if caching_ratio is not None else UVM_CACHING_RATIO
    hbm, ddr = hw.hbm, hw.ddr
    table: dict[ComputeKernel, Any]
    if hw.device == ComputeDevice.CPU:
        table = {ComputeKernel.DENSE: 0.5 * ddr, ComputeKernel.FUSED: 1 * ddr}
    else:
        table = {
            ComputeKernel.DENSE: 0.5 * hbm,
            ComputeKernel.FUSED: 1 * hbm,
            ComputeKernel.FUSED_UVM: hw.hbm_to_ddr / 10,
            ComputeKernel.FUSED_UVM_CACHING: (cr * hbm + (1 - cr) * hw.hbm_to_ddr) / 10,
        }
    if kernel not in table:
        raise ValueError(f"no kernel bandwidth for {kernel.value} on {hw.device.value}")
    return table[kernel]


def comms_ms(hw: Links, collective: Collective, size: np.ndarray | float, world_size: int,
             local_world_size: int) -> np.ndarray:
    """Time of a collective moving ``size`` bytes over ``world_size`` ranks: the link's latency plus
    ``size`` over ``BasicCommsBandwidths.get_bw``."""
    if collective == Collective.ALL_REDUCE:
        bw, latency = hw.inter_host * local_world_size, hw.inter_host_latency_ms  # one NIC per GPU
    elif world_size <= local_world_size:
        bw, latency = hw.intra_host, hw.intra_host_latency_ms
    else:
        bw, latency = hw.inter_host, hw.inter_host_latency_ms
    out: np.ndarray = latency + np.divide(size, bw)
    return out
