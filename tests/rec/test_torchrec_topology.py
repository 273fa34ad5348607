from __future__ import annotations

import pytest

from rec.topology import read_topology, topology_from_dict
from rec.topology import types as ours
from rec.torchrec.topology import torchrec_topology
from tests.paths import TOPOLOGIES

constants = pytest.importorskip("torchrec.distributed.planner.constants")

GiB = 1024**3


def test_our_defaults_are_torchrecs_constants():
    for name in ("HBM_CAP", "DDR_CAP", "INTRA_NODE_BANDWIDTH", "CROSS_NODE_BANDWIDTH", "HBM_MEM_BW", "DDR_MEM_BW"):
        assert getattr(ours, name) == getattr(constants, name), name
    assert ours.BATCH_SIZE == constants.BATCH_SIZE


@pytest.mark.parametrize("name", ["h100_1x8.yaml", "h100_2x8.yaml"])
def test_gpu_topology_converts_rank_for_rank(name):
    ours_t = read_topology(TOPOLOGIES / name)
    theirs = torchrec_topology(ours_t)
    assert (theirs.world_size, theirs.local_world_size, theirs.compute_device) == (
        ours_t.world_size,
        ours_t.local_world_size,
        "cuda",
    )
    assert len(theirs.devices) == ours_t.world_size
    assert {d.storage.hbm for d in theirs.devices} == {80 * GiB}
    assert {d.storage.ddr for d in theirs.devices} == {128 * GiB}
    assert {d.storage.ssd for d in theirs.devices} == {0}  # no SSD tier: TorchRec plans no key_value table


def test_bandwidths_written_in_bytes_per_second_reach_torchrec_in_bytes_per_ms():
    t = topology_from_dict(
        {
            "world_size": 16,
            "local_world_size": 8,
            "compute_device": "cuda",
            "intra_host_bw": "450GB/s",
            "inter_host_bw": "50GB/s",
            "hbm_mem_bw": "3TB/s",
            "ddr_mem_bw": "100GB/s",
        }
    )
    theirs = torchrec_topology(t)
    assert theirs.intra_host_bw == 450e9 / 1000
    assert theirs.inter_host_bw == 50e9 / 1000
    assert theirs.hbm_mem_bw == 3e12 / 1000
    assert theirs.ddr_mem_bw == 100e9 / 1000


def test_default_bandwidths_are_torchrecs_own():
    theirs = torchrec_topology(topology_from_dict({"world_size": 8, "compute_device": "cuda"}))
    assert theirs.intra_host_bw == constants.INTRA_NODE_BANDWIDTH
    assert theirs.inter_host_bw == constants.CROSS_NODE_BANDWIDTH
    assert theirs.hbm_mem_bw == constants.HBM_MEM_BW
    assert theirs.ddr_mem_bw == constants.DDR_MEM_BW


def test_cpu_topology_keeps_tables_in_ddr_as_torchrec_does():
    theirs = torchrec_topology(read_topology(TOPOLOGIES / "cpu_2proc.yaml"))
    assert (theirs.world_size, theirs.local_world_size, theirs.compute_device) == (2, 2, "cpu")
    assert [d.storage.hbm for d in theirs.devices] == [0, 0]  # TorchRec ignores hbm_cap on cpu
    assert [d.storage.ddr for d in theirs.devices] == [16 * GiB, 16 * GiB]

