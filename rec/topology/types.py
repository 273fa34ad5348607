"""The cluster the plan is for; keys and units follow torchrec's ``Topology``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rec.sharding import ComputeDevice

# TorchRec 1.8 defaults (torchrec/distributed/planner/constants.py), used when a key is absent.
GB = 1024**3
HBM_CAP = 32 * GB
DDR_CAP = 128 * GB
INTRA_NODE_BANDWIDTH = 600 * 1024 * 1024 * 1024 / 1000  # bytes/ms
CROSS_NODE_BANDWIDTH = 12.5 * 1024 * 1024 * 1024 / 1000
HBM_MEM_BW = 897 * 1024 * 1024 * 1024 / 1000
DDR_MEM_BW = 51 * 1024 * 1024 * 1024 / 1000
BATCH_SIZE = 512

# Bounds, so that the cost model's int64 byte counts cannot wrap around (see rec.spec.limits) and a
# mistyped number fails at once instead of allocating gigabytes of per-rank arrays.
MAX_WORLD_SIZE = 2**16
MAX_SAMPLES_PER_STEP = 2**30  # world_size x batch_size
MAX_RANK_BYTES = 2**50  # hbm_cap, ddr_cap: 1 PiB per rank
MAX_CLUSTER_BYTES = 2**60  # world_size x capacity: 1 EiB
MIN_BANDWIDTH = 1.0  # bytes/s: keeps every time estimate finite
MAX_BANDWIDTH = 1e18  # bytes/s: 1 EB/s, 10^4 x the fastest link


@dataclass(frozen=True)
class Topology:
    """Validated by ``rec.topology.topology_from_dict``; YAML bandwidths (bytes/s) arrive here in bytes/ms."""

    world_size: int
    local_world_size: int
    compute_device: ComputeDevice
    hbm_cap: int  # bytes per rank (TorchRec gives cpu ranks 0 HBM)
    ddr_cap: int  # bytes per rank, not per host
    intra_host_bw: float  # bytes/ms, TorchRec's unit
    inter_host_bw: float  # bytes/ms
    hbm_mem_bw: float  # bytes/ms
    ddr_mem_bw: float  # bytes/ms
    batch_size: int  # per rank
    storage_reservation: float  # fraction of HBM kept free, in [0, 1)
    topology_hash: str = ""

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["compute_device"] = self.compute_device.value
        d.pop("topology_hash")
        return d
