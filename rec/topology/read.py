"""``read_topology``: a topology YAML file -> a validated ``Topology``."""

from __future__ import annotations

from pathlib import Path

import yaml

from rec.errors import InputError, Problem
from rec.topology.types import Topology
from rec.topology.validate import topology_from_dict

EXTENSIONS = (".yaml", ".yml", ".json")  # JSON is YAML too


def read_topology(path: str | Path) -> Topology:
    """Read and validate a topology YAML file."""
    path = Path(path)
    title = f"Cannot read topology {path}"
    if path.suffix.lower() not in EXTENSIONS:
        raise InputError(title, [Problem(str(path), f"unsupported extension (use one of {', '.join(EXTENSIONS)})")])
    if not path.is_file():
        raise InputError(title, [Problem(str(path), "is a directory, not a file" if path.is_dir() else "no such file")])
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(title, [Problem(str(path), e.strerror or str(e))]) from e
    except yaml.YAMLError as e:
        raise InputError(title, [Problem(str(path), f"not valid YAML: {' '.join(str(e).split())}")]) from e
    return topology_from_dict(document if document is not None else {}, source=str(path))
