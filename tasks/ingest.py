"""Step 1, spec ingestion: read and validate the spec and the topology, hash both.

It has no settings: what it reads is its whole input. A caller that ingested already (``shardflow
run`` checks its inputs before Prefect starts) hands the ``Inputs`` on; nothing is read again
behind its back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rec.spec import Spec, read_spec
from rec.topology import Topology, read_topology


@dataclass(frozen=True)
class Inputs:
    """A validated spec and topology (each carries its hash) and where they were read from."""

    spec: Spec
    topology: Topology
    spec_path: str  # absolute
    topology_path: str

    def read_from(self, spec_path: str, topology_path: str) -> bool:
        """Whether these are the inputs of the files ``spec_path`` and ``topology_path``."""
        return (self.spec_path, self.topology_path) == _resolved(spec_path, topology_path)


def ingest(spec_path: str, topology_path: str) -> Inputs:
    """Read and validate both files; InputError names every problem of both at once."""
    from rec.errors import Collected

    found = Collected()
    spec = found.run(lambda: read_spec(spec_path))
    topology = found.run(lambda: read_topology(topology_path))
    found.raise_if_any()
    assert spec is not None and topology is not None
    return Inputs(spec, topology, *_resolved(spec_path, topology_path))


def _resolved(spec_path: str, topology_path: str) -> tuple[str, str]:
    return str(Path(spec_path).resolve()), str(Path(topology_path).resolve())
