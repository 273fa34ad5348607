from __future__ import annotations

import pytest

from rec.errors import InputError
from rec.sharding import ComputeDevice
from rec.topology import read_topology, topology_from_dict, topology_hash, topology_to_dict
from rec.topology.types import (
    BATCH_SIZE,
    CROSS_NODE_BANDWIDTH,
    DDR_CAP,
    DDR_MEM_BW,
    HBM_CAP,
    HBM_MEM_BW,
    INTRA_NODE_BANDWIDTH,
)
from rec.units import format_bytes, parse_bytes, parse_bytes_per_second
from tests.paths import TOPOLOGIES

GiB = 1024**3
MINIMAL = {"world_size": 16, "local_world_size": 8, "compute_device": "cuda"}


def problems_of(d: dict) -> list[str]:
    with pytest.raises(InputError) as caught:
        topology_from_dict(d)
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (1024, 1024),
        ("1024", 1024),
        ("80GiB", 80 * GiB),
        ("512 GB", 512 * 1000**3),
        ("1.5TiB", 3 * 1024**4 // 2),
        ("4 KB", 4000),
        ("2MiB", 2 * 1024**2),
        ("7B", 7),
        ("80gib", 80 * GiB),
        (8.0e9, 8_000_000_000),
    ],
)
def test_byte_sizes_read_decimal_and_binary_units(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["80 GiBs", "lots", "1.5.2GB", True, 1.5, "16.5", "0.5", "1.9 B"])
def test_unreadable_byte_sizes_are_refused(text):
    """A fractional count of bytes is refused written as text ("16.5") as written as a number (16.5),
    where it was once rounded down (to 16 B, and "0.5" to nothing)."""
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_bandwidths_read_with_or_without_per_second():
    assert parse_bytes_per_second("600GB/s") == 600e9
    assert parse_bytes_per_second("25 GiB/s") == 25 * GiB
    assert parse_bytes_per_second(12.5e9) == 12.5e9
    assert parse_bytes_per_second("0.9") == 0.9  # a bandwidth need not be whole bytes


def test_format_bytes_is_human_readable():
    sizes = (512, 1536, 80 * GiB, 1.5 * 1024**4, 2**60)
    assert [format_bytes(n) for n in sizes] == ["512 B", "1.5 KiB", "80.0 GiB", "1.5 TiB", "1.0 EiB"]


def test_absent_keys_take_torchrec_defaults():
    t = topology_from_dict({"world_size": 4, "compute_device": "cuda"})
    assert (t.local_world_size, t.hbm_cap, t.ddr_cap, t.batch_size) == (4, HBM_CAP, DDR_CAP, BATCH_SIZE)
    assert (t.intra_host_bw, t.inter_host_bw) == (INTRA_NODE_BANDWIDTH, CROSS_NODE_BANDWIDTH)
    assert (t.hbm_mem_bw, t.ddr_mem_bw) == (HBM_MEM_BW, DDR_MEM_BW)
    assert t.storage_reservation == 0.15


def test_torchrec_default_constants_are_torchrecs_in_bytes_per_ms():
    # Values from torchrec/distributed/planner/constants.py (checked against the library in
    # test_torchrec_topology.py); here, the units: 600 GiB/s is 600 GiB per 1000 ms.
    assert INTRA_NODE_BANDWIDTH == 600 * GiB / 1000
    assert (HBM_CAP, DDR_CAP, BATCH_SIZE) == (32 * GiB, 128 * GiB, 512)


def test_bandwidths_are_written_in_bytes_per_second_and_stored_in_bytes_per_ms():
    t = topology_from_dict({**MINIMAL, "intra_host_bw": "450GB/s", "inter_host_bw": 50e9, "hbm_mem_bw": "3.35TB/s"})
    assert t.intra_host_bw == 450e9 / 1000
    assert t.inter_host_bw == 50e9 / 1000
    assert t.hbm_mem_bw == pytest.approx(3.35e12 / 1000)


def test_cpu_ranks_have_no_hbm_unless_given():
    assert topology_from_dict({"world_size": 2, "compute_device": "cpu"}).hbm_cap == 0
    assert topology_from_dict({"world_size": 2, "compute_device": "cpu", "hbm_cap": "4GiB"}).hbm_cap == 4 * GiB


@pytest.mark.parametrize(
    ("name", "world", "local", "device", "hbm"),
    [
        ("h100_1x8.yaml", 8, 8, ComputeDevice.CUDA, 80 * GiB),
        ("h100_2x8.yaml", 16, 8, ComputeDevice.CUDA, 80 * GiB),
        ("cpu_2proc.yaml", 2, 2, ComputeDevice.CPU, 4 * GiB),
    ],
)
def test_example_topologies_read(name, world, local, device, hbm):
    t = read_topology(TOPOLOGIES / name)
    assert (t.world_size, t.local_world_size, t.compute_device, t.hbm_cap) == (world, local, device, hbm)
    assert t.num_hosts == world // local
    assert t.topology_hash == topology_hash(t)


def test_h100_examples_give_each_rank_an_eighth_of_a_1tib_host():
    assert read_topology(TOPOLOGIES / "h100_2x8.yaml").ddr_cap == 1024**4 // 8


def test_hash_ignores_key_order_and_unit_spelling_but_not_content():
    a = topology_from_dict({**MINIMAL, "hbm_cap": "80GiB", "ddr_cap": "1TiB"})
    b = topology_from_dict({"ddr_cap": 1024**4, "compute_device": "CUDA", "hbm_cap": 80 * GiB, **MINIMAL})
    c = topology_from_dict({**MINIMAL, "hbm_cap": "80GB", "ddr_cap": "1TiB"})
    assert a.topology_hash == b.topology_hash != c.topology_hash
    assert len(a.topology_hash) == 16


def test_topology_to_dict_reads_back_to_the_same_topology():
    for name in ("h100_1x8.yaml", "h100_2x8.yaml", "cpu_2proc.yaml"):
        t = read_topology(TOPOLOGIES / name)
        assert topology_from_dict(topology_to_dict(t)) == t
    custom = topology_from_dict({**MINIMAL, "intra_host_bw": "450GB/s", "inter_host_bw": "50GB/s"})
    assert topology_from_dict(topology_to_dict(custom)) == custom


def test_all_problems_are_reported_together():
    problems = problems_of(
        {
            "world_size": 12,
            "local_world_size": 8,
            "compute_device": "tpu",
            "hbm_cap": "-1GiB",
            "ddr_cap": "lots",
            "inter_host_bw": 0,
            "storage_reservation": 1.0,
            "batch_size": 0,
            "gpus": 8,
        }
    )
    assert problems[0].startswith("gpus: unknown key; known keys: world_size, local_world_size")
    assert "compute_device: expected one of cpu, cuda, got 'tpu'" in problems
    assert any(p.startswith("hbm_cap: cannot read '-1GiB' as a byte size") for p in problems)
    assert any(p.startswith("ddr_cap: cannot read 'lots' as a byte size") for p in problems)
    assert "inter_host_bw: must be > 0 bytes/s, got 0" in problems
    assert "storage_reservation: expected a fraction in [0, 1), got 1.0" in problems
    assert "batch_size: must be > 0, got 0" in problems
    assert "local_world_size: world_size 12 is not a multiple of local_world_size 8" in problems
    assert len(problems) == 8


def test_a_misspelt_key_gets_a_suggestion():
    assert problems_of({**MINIMAL, "hbm_capacity": "80GiB"})[0].startswith(
        "hbm_capacity: unknown key; did you mean 'hbm_cap'?"
    )


def test_required_keys_and_types_are_checked():
    assert problems_of({"local_world_size": 8}) == ["world_size: is required", "compute_device: is required"]
    assert problems_of({"world_size": "8", "compute_device": "cuda"}) == [
        "world_size: expected a positive integer, got '8'"
    ]
    assert problems_of({**MINIMAL, "hbm_cap": 0}) == ["hbm_cap: must be > 0 for compute_device cuda"]
    assert problems_of({**MINIMAL, "ddr_cap": 0}) == ["ddr_cap: must be > 0 bytes, got 0"]


def test_a_topology_must_be_a_mapping(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("- world_size: 8\n")
    with pytest.raises(InputError, match="expected a mapping of keys"):
        read_topology(path)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("missing.yaml", None, "no such file"),
        ("t.toml", "", "unsupported extension"),
        ("bad.yaml", "world_size: [\n", "not valid YAML"),
        ("empty.yaml", "", "the file is empty"),
    ],
)
def test_unreadable_topology_files_are_input_errors(tmp_path, name, text, expected):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(InputError, match=expected):
        read_topology(path)


@pytest.mark.parametrize(
    ("keys", "ok"),
    [
        ({"world_size": 65_536, "local_world_size": 8}, True),
        ({"world_size": 65_537, "local_world_size": 1}, False),
        ({"world_size": 1024, "local_world_size": 8, "batch_size": 2**20}, True),  # 2^30 samples per step
        ({"world_size": 1024, "local_world_size": 8, "batch_size": 2**20 + 1}, False),
        ({"hbm_cap": "1PiB"}, True),
        ({"hbm_cap": 2**50 + 1}, False),
        ({"world_size": 1024, "local_world_size": 8, "ddr_cap": "1PiB"}, True),  # 2^60 bytes in all
        ({"world_size": 1025, "local_world_size": 5, "ddr_cap": "1PiB"}, False),
        ({"hbm_mem_bw": 1}, True),
        ({"hbm_mem_bw": 0.5}, False),
        ({"hbm_mem_bw": 1e18}, True),
        ({"hbm_mem_bw": "1e400GB/s"}, False),
        ({"world_size": float("nan")}, False),
        ({"hbm_cap": "1e999999999GB"}, False),  # refused at once, not computed exactly
    ],
)
def test_topology_bounds_are_exact(keys, ok):
    if ok:
        assert topology_from_dict({**MINIMAL, **keys})
    else:
        assert problems_of({**MINIMAL, **keys})


def test_duplicate_keys_non_utf8_and_odd_paths_are_input_errors(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("world_size: 8\ncompute_device: cuda\nworld_size: 16\n")
    with pytest.raises(InputError, match="the key 'world_size' is written twice"):
        read_topology(dup)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"world_size: 8\ncompute_device: cuda # caf\xe9\n")
    with pytest.raises(InputError, match=r"not UTF-8 text \(byte 0xe9 at offset 40, line 2\)"):
        read_topology(latin)
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    with pytest.raises(InputError, match="symbolic link loop"):
        read_topology(loop)
