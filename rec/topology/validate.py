"""A topology mapping (as written in YAML) -> a validated ``Topology``, or InputError with every problem.

Units: capacities are bytes per rank. Bandwidths are written in bytes/s (DESIGN.md) and stored in
bytes/ms, TorchRec's unit (``torchrec/distributed/planner/constants.py``), so the cost model and
``to_torchrec`` use them as they are.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from numbers import Integral, Real

from rec.errors import ProblemList
from rec.hashing import content_hash
from rec.sharding import ComputeDevice
from rec.topology.types import (
    BATCH_SIZE,
    CROSS_NODE_BANDWIDTH,
    DDR_CAP,
    DDR_MEM_BW,
    HBM_CAP,
    HBM_MEM_BW,
    INTRA_NODE_BANDWIDTH,
    Topology,
)
from rec.units import parse_bytes, parse_bytes_per_second

MS_PER_S = 1000
BANDWIDTHS = ("intra_host_bw", "inter_host_bw", "hbm_mem_bw", "ddr_mem_bw")
REQUIRED = ("world_size", "compute_device")
KEYS = (
    "world_size",
    "local_world_size",
    "compute_device",
    "hbm_cap",
    "ddr_cap",
    *BANDWIDTHS,
    "batch_size",
    "storage_reservation",
)
TOPOLOGY_HASH_FORMAT = "shardflow.topology/v1"

# TorchRec's defaults for absent keys (bandwidths in bytes/ms, like the stored values).
DEFAULTS = {
    "hbm_cap": HBM_CAP,
    "ddr_cap": DDR_CAP,
    "intra_host_bw": INTRA_NODE_BANDWIDTH,
    "inter_host_bw": CROSS_NODE_BANDWIDTH,
    "hbm_mem_bw": HBM_MEM_BW,
    "ddr_mem_bw": DDR_MEM_BW,
    "batch_size": BATCH_SIZE,
    "storage_reservation": 0.15,  # EmbeddingShardingPlanner's heuristical_storage_reservation_percentage
}


def topology_from_dict(d: Mapping, source: str = "topology") -> Topology:
    """Validate a topology mapping (YAML keys and units) into a ``Topology`` with its hash filled."""
    title = f"Invalid topology {source}"
    problems = ProblemList()
    if not isinstance(d, Mapping):
        problems.add(source, f"expected a mapping of keys ({', '.join(KEYS)}), got {type(d).__name__}")
        problems.raise_if_any(title)
    for key in sorted(set(map(str, d)) - set(KEYS)):
        hint = difflib.get_close_matches(key, KEYS, n=1)
        suggestion = f"did you mean '{hint[0]}'? " if hint else ""
        problems.add(key, f"unknown key; {suggestion}known keys: {', '.join(KEYS)}")
    for key in REQUIRED:
        if d.get(key) is None:
            problems.add(key, "is required")

    values: dict[str, object] = {}
    for key, parse in _PARSERS.items():
        if d.get(key) is None:
            continue
        try:
            values[key] = parse(d[key])
        except ValueError as e:
            problems.add(key, str(e))
    _check_consistency(values, problems)
    problems.raise_if_any(title)

    world = values["world_size"]
    topology = Topology(
        world_size=world,
        local_world_size=values.get("local_world_size", world),
        compute_device=values["compute_device"],
        **{key: values.get(key, default) for key, default in DEFAULTS.items()},
    )
    if "hbm_cap" not in values and topology.compute_device is ComputeDevice.CPU:
        topology = replace(topology, hbm_cap=0)  # as TorchRec: cpu ranks have no HBM
    return replace(topology, topology_hash=topology_hash(topology))


def topology_hash(topology: Topology) -> str:
    """16 hex digits of sha256 over the normalized topology (keys sorted, canonical JSON)."""
    return content_hash({"format": TOPOLOGY_HASH_FORMAT, "topology": topology.to_dict()})


def topology_to_dict(topology: Topology) -> dict:
    """The topology in YAML keys and units (bandwidths in bytes/s): ``topology_from_dict`` reads it back."""
    d = topology.to_dict()
    for key in BANDWIDTHS:
        d[key] = d[key] * MS_PER_S
    return d


def _check_consistency(values: dict, problems: ProblemList) -> None:
    world, local = values.get("world_size"), values.get("local_world_size")
    if isinstance(world, int) and isinstance(local, int) and world % local:
        problems.add("local_world_size", f"world_size {world} is not a multiple of local_world_size {local}")
    hbm = values.get("hbm_cap")
    if values.get("compute_device") is ComputeDevice.CUDA and hbm == 0:
        problems.add("hbm_cap", "must be > 0 for compute_device cuda")


def _positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise ValueError(f"expected a positive integer, got {value!r}")
    if isinstance(value, Real) and not isinstance(value, Integral):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"expected a positive integer, got {value!r}")
    if int(value) <= 0:
        raise ValueError(f"must be > 0, got {value!r}")
    return int(value)


def _capacity(allow_zero: bool) -> Callable[[object], int]:
    def parse(value: object) -> int:
        size = parse_bytes(value)
        if size < 0 or (size == 0 and not allow_zero):
            raise ValueError(f"must be {'>= 0' if allow_zero else '> 0'} bytes, got {value!r}")
        return size

    return parse


def _bandwidth(value: object) -> float:
    per_second = parse_bytes_per_second(value)
    if not per_second > 0:
        raise ValueError(f"must be > 0 bytes/s, got {value!r}")
    return per_second / MS_PER_S


def _compute_device(value: object) -> ComputeDevice:
    try:
        return ComputeDevice(str(value).strip().lower())
    except ValueError:
        raise ValueError(f"expected one of {', '.join(d.value for d in ComputeDevice)}, got {value!r}") from None


def _reservation(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 <= value < 1:
        raise ValueError(f"expected a fraction in [0, 1), got {value!r}")
    return float(value)


_PARSERS: dict[str, Callable[[object], object]] = {
    "world_size": _positive_int,
    "local_world_size": _positive_int,
    "compute_device": _compute_device,
    # cpu ranks have no HBM in TorchRec (its Topology gives them 0), so 0 is fine there.
    "hbm_cap": _capacity(allow_zero=True),
    "ddr_cap": _capacity(allow_zero=False),
    **{key: _bandwidth for key in BANDWIDTHS},
    "batch_size": _positive_int,
    "storage_reservation": _reservation,
}
