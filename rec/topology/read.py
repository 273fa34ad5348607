"""``read_topology``: a topology YAML file -> a validated ``Topology``."""

from __future__ import annotations

from pathlib import Path

from rec.documents import DocumentError, load_yaml
from rec.errors import InputError, Problem
from rec.input_files import MAX_TOPOLOGY_FILE_BYTES, read_text
from rec.topology.types import Topology
from rec.topology.validate import topology_from_dict

EXTENSIONS = (".yaml", ".yml", ".json")  # JSON is YAML too


def read_topology(path: str | Path) -> Topology:
    """Read and validate a topology YAML file."""
    path = Path(path)
    title = f"Cannot read topology {path}"
    if path.suffix.lower() not in EXTENSIONS:
        raise InputError(title, [Problem(str(path), f"unsupported extension (use one of {', '.join(EXTENSIONS)})")])
    text = read_text(path, "topology", MAX_TOPOLOGY_FILE_BYTES)
    try:
        document = load_yaml(text)
    except DocumentError as e:
        raise InputError(title, [Problem(str(path), str(e))]) from None
    if document is None:
        reason = "the file is empty (a topology needs world_size and compute_device)"
        raise InputError(title, [Problem(str(path), reason)])
    return topology_from_dict(document, source=str(path))
