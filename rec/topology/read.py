"""``read_topology``: a topology YAML file -> a validated ``Topology``."""

from __future__ import annotations

from pathlib import Path

from rec.input_files import MAX_TOPOLOGY_FILE_BYTES, read_yaml_file
from rec.topology.types import Topology
from rec.topology.validate import topology_from_dict


def read_topology(path: str | Path) -> Topology:
    """Read and validate a topology YAML file."""
    document = read_yaml_file(path, "topology", MAX_TOPOLOGY_FILE_BYTES,
                              "a topology needs world_size and compute_device")
    return topology_from_dict(document, source=str(path))
