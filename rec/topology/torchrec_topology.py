"""Our ``Topology`` as TorchRec's planner objects; the only place in ``rec`` that imports torchrec."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from rec.topology.types import Topology

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import Topology as TorchrecTopology


def to_torchrec(topology: Topology) -> TorchrecTopology:
    """TorchRec's ``Topology`` with the same ranks, per-rank capacities and bandwidths (bytes/ms)."""
    from torchrec.distributed.planner.types import HardwareConfig, KernelConfig, TopologyFactory, TrainerConfig

    # The factory is TorchRec's supported way to build a Topology; with use_hardware_based_bandwidth
    # it takes our bandwidths instead of its constants.
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=topology.world_size,
            local_world_size=topology.local_world_size,
            hbm_cap_bytes=topology.hbm_cap,
            ddr_cap_bytes=topology.ddr_cap,
        ),
        hardware_config=HardwareConfig(
            intra_host_bw=topology.intra_host_bw,
            inter_host_bw=topology.inter_host_bw,
            hbm_mem_bw=topology.hbm_mem_bw,
            ddr_mem_bw=topology.ddr_mem_bw,
        ),
        kernel_config=KernelConfig(compute_device=topology.compute_device.value, use_hardware_based_bandwidth=True),
    )


def torchrec_planner_kwargs(topology: Topology) -> dict[str, Any]:
    """Keyword arguments for ``EmbeddingShardingPlanner``: topology, batch size and storage reservation."""
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

    # The planner's own default reservation, with our fraction; its FutureWarning is about that default.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        reservation = HeuristicalStorageReservation(percentage=topology.storage_reservation)
    return {"topology": to_torchrec(topology), "batch_size": topology.batch_size, "storage_reservation": reservation}
