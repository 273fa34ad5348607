"""Step 1, spec ingestion: read and validate the spec and the topology, hash both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rec.spec import Spec, read_spec
from rec.topology import Topology, read_topology


@dataclass(frozen=True)
class Inputs:
    """A validated spec and topology (each carries its hash) and where they were read from."""

    spec: Spec
    topology: Topology
    spec_path: str  # absolute
    topology_path: str


@task(name="ingest-spec", cache_policy=NO_CACHE)
def ingest_spec(spec_path: str, topology_path: str) -> Inputs:
    """Read and validate both files; InputError names every problem (never retried)."""
    return Inputs(read_spec(spec_path), read_topology(topology_path),
                  str(Path(spec_path).resolve()), str(Path(topology_path).resolve()))
