"""Cluster topologies: read a YAML file, validate every key, hash the content.

``rec.torchrec.topology.torchrec_topology`` converts to TorchRec's ``Topology`` (imports torch).
"""

from __future__ import annotations

from rec.topology.read import read_topology
from rec.topology.types import Topology
from rec.topology.validate import topology_from_dict, topology_hash, topology_to_dict

__all__ = ["Topology", "read_topology", "topology_from_dict", "topology_hash", "topology_to_dict"]
