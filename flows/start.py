"""What every flow starts with: where its state and its MLflow records go, the outbox delivered,
step progress in the flow run's log; and step 1's inputs, read by the flow or handed over by a
caller that read them already."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from flows.progress import progress_in_run_log
from rec.errors import InputError, Problem
from tasks.ingest import Inputs
from tasks.mlflow_log import deliver_outbox
from tasks.outbox import Delivery
from tasks.paths import DEFAULT_STATE_DIR, in_work_dir, plan_cache_dir
from tasks.steps import ingest_task
from tasks.tracking import Tracking, TrackingSettings, tracking_for


@dataclass(frozen=True)
class Started:
    tracking: Tracking  # where the flow's runs go (resolved: URI, experiment, outbox)
    state_dir: str  # shardflow's own state: the outbox and the plan cache
    delivery: Delivery  # what the outbox delivered as the flow started

    @property
    def plan_cache_dir(self) -> str:
        return plan_cache_dir(self.state_dir)


@contextmanager
def started(settings: TrackingSettings, work_dir: str | None) -> Iterator[Started]:
    """A flow's start: ``settings`` resolved, their defaults (the state directory, the SQLite
    store without ``tracking_uri`` or ``MLFLOW_TRACKING_URI``) in ``work_dir`` (none: the working
    directory); records that waited in the outbox delivered; step progress in the flow run's log
    for the block."""
    if not settings.track:
        raise InputError("Cannot run the flow:", [Problem(
            "tracking.track", "is false; the flows always record (through the outbox while MLflow is away): "
                              "shardflow train --no-track trains without recording")])
    state_dir = in_work_dir(work_dir, DEFAULT_STATE_DIR) if settings.state_dir == DEFAULT_STATE_DIR \
        else settings.state_dir
    tracking = tracking_for(settings.tracking_uri, settings.experiment, state_dir, work_dir)
    delivery = deliver_outbox(tracking)
    with progress_in_run_log():
        yield Started(tracking, state_dir, delivery)


class Ingested:
    """``Inputs`` a caller read and checked already, handed to a flow (its ``ingested``
    parameter) so that the flow does not read the files again: ``shardflow run`` checks its
    inputs before Prefect starts.

    Not a dataclass on purpose: Prefect records a flow run's parameters as JSON, and a dataclass
    holding the spec it records table by table (seconds and tens of MB at 100,000 tables). This
    object it cannot encode (slots, no items): it records ``<Ingested>``
    (tests/flows/test_training_settings.py pins this to Prefect's behaviour)."""

    __slots__ = ("inputs",)

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs


def inputs_for(spec_path: str, topology_path: str, ingested: Ingested | None) -> Inputs:
    """Step 1: the inputs a caller ingested from these files, or read now (the ``ingest-spec`` task)."""
    if ingested is None:
        return ingest_task(spec_path, topology_path)
    if not ingested.inputs.read_from(spec_path, topology_path):
        raise ValueError(f"the ingested inputs were read from {ingested.inputs.spec_path} and "
                         f"{ingested.inputs.topology_path}, not {spec_path} and {topology_path}")
    return ingested.inputs
