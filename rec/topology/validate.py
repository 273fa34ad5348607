"""A topology mapping (as written in YAML) -> a validated ``Topology``, or InputError with every problem.

Units: capacities are bytes per rank. Bandwidths are written in bytes/s (docs/topology.md) and stored in
bytes/ms, TorchRec's unit (``torchrec/distributed/planner/constants.py``), so the cost model and
``to_torchrec`` use them as they are.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import replace
from numbers import Integral, Real
from typing import Any

from rec.errors import InputError, Problem, ProblemList, show
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
    MAX_BANDWIDTH,
    MAX_CLUSTER_BYTES,
    MAX_RANK_BYTES,
    MAX_SAMPLES_PER_STEP,
    MAX_WORLD_SIZE,
    MIN_BANDWIDTH,
    Topology,
)
from rec.units import format_bytes, format_count, parse_bytes, parse_bytes_per_second, positive_whole, power_of_two

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


def topology_from_dict(d: object, source: str = "topology") -> Topology:
    """Validate a topology mapping (YAML keys and units) into a ``Topology`` with its hash filled."""
    title = f"Invalid topology {source}"
    if not isinstance(d, Mapping):
        reason = f"expected a mapping of keys ({', '.join(KEYS)}), got {type(d).__name__}"
        raise InputError(title, [Problem(source, reason)])
    problems = ProblemList()
    odd = [show(k) for k in d if not isinstance(k, str)]
    if odd:
        problems.add(source, f"keys must be text, got {', '.join(sorted(odd))}")
        d = {k: v for k, v in d.items() if isinstance(k, str)}
    for key in sorted(set(d) - set(KEYS)):
        hint = difflib.get_close_matches(key, KEYS, n=1) if len(key) <= 64 else []
        suggestion = f"did you mean '{hint[0]}'? " if hint else ""
        problems.add(key, f"unknown key; {suggestion}known keys: {', '.join(KEYS)}")
    for key in REQUIRED:
        if d.get(key) is None:
            problems.add(key, "is required")

    values: dict[str, Any] = {}
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


def topology_to_dict(topology: Topology) -> dict[str, Any]:
    """The topology in YAML keys and units (bandwidths in bytes/s): ``topology_from_dict`` reads it back."""
    d = topology.to_dict()
    for key in BANDWIDTHS:
        d[key] = d[key] * MS_PER_S
    return d


def _check_consistency(values: dict[str, Any], problems: ProblemList) -> None:
    world, local = values.get("world_size"), values.get("local_world_size")
    if isinstance(world, int) and isinstance(local, int) and world % local:
        problems.add("local_world_size", f"world_size {world} is not a multiple of local_world_size {local}")
    hbm = values.get("hbm_cap")
    if values.get("compute_device") is ComputeDevice.CUDA and hbm == 0:
        problems.add("hbm_cap", "must be > 0 for compute_device cuda")
    if not isinstance(world, int):
        return
    batch = values.get("batch_size", BATCH_SIZE)
    if isinstance(batch, int) and world * batch > MAX_SAMPLES_PER_STEP:
        problems.add("batch_size", (
            f"world_size x batch_size is {world * batch:,} samples per step, more than "
            f"{power_of_two(MAX_SAMPLES_PER_STEP)} ({MAX_SAMPLES_PER_STEP:,}): the cost model's 64-bit byte "
            "counts of input and output buffers would overflow"
        ))
    for key in ("hbm_cap", "ddr_cap"):
        cap = values.get(key, DEFAULTS[key])
        if isinstance(cap, int) and world * cap > MAX_CLUSTER_BYTES:
            problems.add(key, (
                f"world_size x {key} is {format_bytes(world * cap)}, more than {format_bytes(MAX_CLUSTER_BYTES)}: "
                "the cost model adds up capacities in 64-bit integers"
            ))


def _positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):  # YAML's ints, not text
        raise ValueError(f"expected a positive integer, got {show(value)}")
    return positive_whole(int(value) if isinstance(value, Integral) else float(value), value)


def _world_size(value: object) -> int:
    world = _positive_int(value)
    if world > MAX_WORLD_SIZE:
        raise ValueError(
            f"must be at most {MAX_WORLD_SIZE:,}, got {format_count(world)}: the cost model counts a table's bytes "
            "on every rank in 64-bit integers, and planning time grows with the number of ranks"
        )
    return world


def _capacity(allow_zero: bool) -> Callable[[object], int]:
    def parse(value: object) -> int:
        size = parse_bytes(value)
        if size < 0 or (size == 0 and not allow_zero):
            raise ValueError(f"must be {'>= 0' if allow_zero else '> 0'} bytes, got {show(value)}")
        if size > MAX_RANK_BYTES:
            raise ValueError(f"must be at most {format_bytes(MAX_RANK_BYTES)} per rank, got {show(value)}")
        return size

    return parse


def _bandwidth(value: object) -> float:
    per_second = parse_bytes_per_second(value)
    if not per_second > 0:
        raise ValueError(f"must be > 0 bytes/s, got {show(value)}")
    if not MIN_BANDWIDTH <= per_second <= MAX_BANDWIDTH:
        raise ValueError(f"must be between {MIN_BANDWIDTH:g} and {MAX_BANDWIDTH:g} bytes/s, got {show(value)}")
    return per_second / MS_PER_S


def _compute_device(value: object) -> ComputeDevice:
    if isinstance(value, str):
        try:
            return ComputeDevice(value.strip().lower())
        except ValueError:
            pass
    raise ValueError(f"expected one of {', '.join(d.value for d in ComputeDevice)}, got {show(value)}")


def _reservation(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 <= float(value) < 1:
        raise ValueError(f"expected a fraction in [0, 1), got {show(value)}")
    return float(value)




_PARSERS: dict[str, Callable[[object], object]] = {
    "world_size": _world_size,
    "local_world_size": _positive_int,
    "compute_device": _compute_device,
    # cpu ranks have no HBM in TorchRec (its Topology gives them 0), so 0 is fine there.
    "hbm_cap": _capacity(allow_zero=True),
    "ddr_cap": _capacity(allow_zero=False),
    **dict.fromkeys(BANDWIDTHS, _bandwidth),
    "batch_size": _positive_int,
    "storage_reservation": _reservation,
}
