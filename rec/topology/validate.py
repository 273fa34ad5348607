"""A topology mapping (as written in YAML) -> a validated ``Topology``, or InputError with every problem.

Units: capacities are bytes per rank. Bandwidths are written in bytes/s (docs/topology.md) and stored in
bytes/ms, TorchRec's unit (``torchrec/distributed/planner/constants.py``), so the cost model and
``rec.torchrec.topology.torchrec_topology`` use them as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from rec.errors import show
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
from rec.units import format_bytes, format_count, power_of_two
from rec.validation import (
    Problems,
    bandwidth,
    byte_size,
    choice,
    known_keys,
    number_value,
    positive_integer,
    required,
    validated,
)

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
    return validated(read_topology_mapping, d, source, "topology")


def read_topology_mapping(d: object, problems: Problems) -> Topology | None:
    """The ``Topology`` of mapping ``d``, or None with every problem recorded in ``problems`` (a
    plan reader's collector names them ``topology.KEY``)."""
    if not isinstance(d, Mapping):
        problems.add("", f"expected a mapping of keys ({', '.join(KEYS)}), got {type(d).__name__}")
        return None
    before = len(problems.items)
    d = known_keys(d, KEYS, problems)
    required(d, REQUIRED, problems)
    values: dict[str, Any] = {}
    for key, parse in _PARSERS.items():
        if d.get(key) is not None:
            value = problems.take(key, parse, d[key])
            if value is not None:
                values[key] = value
    _check_consistency(values, problems)
    if len(problems.items) > before:
        return None
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


def _check_consistency(values: dict[str, Any], problems: Problems) -> None:
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


def _world_size(value: object) -> int:
    world = positive_integer(value)
    if world > MAX_WORLD_SIZE:
        raise ValueError(
            f"must be at most {MAX_WORLD_SIZE:,}, got {format_count(world)}: the cost model counts a table's bytes "
            "on every rank in 64-bit integers, and planning time grows with the number of ranks"
        )
    return world


def _capacity(allow_zero: bool) -> Callable[[object], int]:
    def parse(value: object) -> int:
        return byte_size(value, minimum=0 if allow_zero else 1, maximum=MAX_RANK_BYTES,
                         describe=lambda n: f"{format_bytes(n)} per rank")

    return parse


def _bandwidth(value: object) -> float:
    return bandwidth(value, minimum=MIN_BANDWIDTH, maximum=MAX_BANDWIDTH) / MS_PER_S


def _reservation(value: object) -> float:
    fraction = number_value(value, "a fraction in [0, 1)")
    if not 0 <= fraction < 1:  # NaN too
        raise ValueError(f"expected a fraction in [0, 1), got {show(value)}")
    return float(fraction)


_PARSERS: dict[str, Callable[[object], object]] = {
    "world_size": _world_size,
    "local_world_size": positive_integer,
    "compute_device": lambda value: choice(ComputeDevice, value),
    # cpu ranks have no HBM in TorchRec (its Topology gives them 0), so 0 is fine there.
    "hbm_cap": _capacity(allow_zero=True),
    "ddr_cap": _capacity(allow_zero=False),
    **dict.fromkeys(BANDWIDTHS, _bandwidth),
    "batch_size": positive_integer,
    "storage_reservation": _reservation,
}
