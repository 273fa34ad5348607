"""Step 1, spec ingestion: read and validate the spec and the topology, hash both.

Like every step it takes one settings dataclass, ``IngestSettings``; it has no knobs yet: what it
reads is its whole input. The CLI and the flows pass it all the same, so a knob added to it becomes
a flag of every command that ingests and a flow parameter, as those of the other steps do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from rec.spec import Spec, read_spec
from rec.topology import Topology, read_topology


@dataclass(frozen=True)
class IngestSettings:
    """How to ingest: no knobs yet (see the module docstring)."""


@dataclass(frozen=True)
class Inputs:
    """A validated spec and topology (each carries its hash) and where they were read from."""

    spec: Spec
    topology: Topology
    spec_path: str  # absolute
    topology_path: str


_INGESTED: ContextVar[tuple[Inputs, IngestSettings] | None] = ContextVar("shardflow_ingested", default=None)


@contextmanager
def ingested(inputs: Inputs, settings: IngestSettings = IngestSettings()) -> Iterator[None]:
    """Within the block, ``ingest`` of the files ``inputs`` was read from, with ``settings``, gives
    ``inputs`` back instead of reading them again: ``shardflow run`` checks its inputs before Prefect
    starts, then runs the flow on the same (ingested once, and exactly what was checked)."""
    token = _INGESTED.set((inputs, settings))
    try:
        yield
    finally:
        _INGESTED.reset(token)


def ingest(spec_path: str, topology_path: str, settings: IngestSettings = IngestSettings()) -> Inputs:
    """Read and validate both files; InputError names every problem of both at once."""
    from rec.errors import InputError

    held = _INGESTED.get()
    if held is not None and held[1] == settings and \
            (held[0].spec_path, held[0].topology_path) == _resolved(spec_path, topology_path):
        return held[0]

    errors: list[InputError] = []
    spec = topology = None
    try:
        spec = read_spec(spec_path)
    except InputError as e:
        errors.append(e)
    try:
        topology = read_topology(topology_path)
    except InputError as e:
        errors.append(e)
    if errors:
        if len(errors) == 1:
            raise errors[0]
        raise InputError("Invalid input:", [p for e in errors for p in e.problems])
    assert spec is not None and topology is not None
    return Inputs(spec, topology, *_resolved(spec_path, topology_path))


def _resolved(spec_path: str, topology_path: str) -> tuple[str, str]:
    return str(Path(spec_path).resolve()), str(Path(topology_path).resolve())
