"""Delivering one record to MLflow, safely repeated: a run is complete, or it is replaced."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.records import (
    PARENT,
    PARENT_RECORD,
    PARTIAL_RECORD,
    PLAN_ID,
    RECORD,
    SPEC_PATH,
    STEP,
    EndRecord,
    RunRecord,
    RunStatus,
    RunStep,
)
from tasks.tracking.queries import find_runs, quoted, run_of_record
from tasks.tracking.store import RunNotFound, one_plan_run_at_a_time

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit


def deliver(client: MlflowClient, experiment_id: str, record: RunRecord | EndRecord,
            files: Path) -> str:
    """Log ``record`` (artifacts from ``files``); returns the run id. Safe to repeat: the run
    carries RECORD only once complete, and a run a failed delivery left (PARTIAL_RECORD) is marked
    FAILED and replaced. A nested run whose parent run is not in MLflow yet goes in anyway, and is
    linked when its parent arrives."""
    if isinstance(record, EndRecord):
        run = run_of_record(client, experiment_id, record.key)
        if run is None:
            raise RunNotFound(f"no run for record {record.key} to finish")
        _log_batch(client, run.info.run_id, params=record.params, metrics=record.metrics, tags=record.tags,
                   timestamp=record.end_ms)
        client.set_terminated(run.info.run_id, record.status, end_time=record.end_ms)
        return str(run.info.run_id)
    existing = run_of_record(client, experiment_id, record.key)
    if existing is not None:
        if record.status == RunStatus.RUNNING or existing.info.status == record.status:
            _link_children(client, experiment_id, record.key, existing.info.run_id)
            return str(existing.info.run_id)
        _discard_partial(client, existing)
    for partial in client.search_runs([experiment_id], f"tags.`{PARTIAL_RECORD}` = {quoted(record.key)}"):
        _discard_partial(client, partial)
    if not record.unique_plan:
        return _new_run(client, experiment_id, record, files)
    with one_plan_run_at_a_time(client.tracking_uri):
        # One plan run per plan and spec file: `replan` finds a file's last plan by its path.
        same = [run for run in find_runs(client, [experiment_id], step=RunStep.PLAN, plan_id=record.tags[PLAN_ID],
                                         finished=True, max_results=100)
                if RECORD in run.data.tags and run.data.tags.get(SPEC_PATH) == record.tags.get(SPEC_PATH)]
        if same:
            return str(same[0].info.run_id)
        return _new_run(client, experiment_id, record, files)


def _new_run(client: MlflowClient, experiment_id: str, record: RunRecord, files: Path) -> str:
    """A run of ``record``, complete (RECORD) once everything is logged; a failure discards it."""
    tags = {**record.tags, STEP: record.step, PARTIAL_RECORD: record.key}
    if record.parent_key:
        tags[PARENT_RECORD] = record.parent_key
        parent = run_of_record(client, experiment_id, record.parent_key)
        if parent is not None:
            tags[PARENT] = parent.info.run_id
    run = client.create_run(experiment_id, start_time=record.start_ms, tags=tags, run_name=record.name)
    run_id = str(run.info.run_id)
    try:
        _log_batch(client, run_id, params=record.params, metrics=record.metrics,
                   series=record.series, timestamp=record.end_ms or record.start_ms)
        for name in record.artifacts:
            if (files / name).exists():
                folder = str(Path(name).parent)
                client.log_artifact(run_id, str(files / name), None if folder == "." else folder)
        if record.status != RunStatus.RUNNING:
            client.set_terminated(run_id, record.status, end_time=record.end_ms)
        _log_batch(client, run_id, tags={RECORD: record.key})
        client.delete_tag(run_id, PARTIAL_RECORD)
    except Exception:
        with suppress(Exception):  # if the store is away, the next delivery discards it
            _discard_partial(client, client.get_run(run_id))
        raise
    _link_children(client, experiment_id, record.key, run_id)
    return run_id


def _link_children(client: MlflowClient, experiment_id: str, key: str, run_id: str) -> None:
    """Nest under ``run_id`` the runs that arrived before their parent (record ``key``) did."""
    from mlflow.entities import RunTag

    for child in client.search_runs([experiment_id], f"tags.`{PARENT_RECORD}` = {quoted(key)}"):
        if PARENT not in child.data.tags:
            client.log_batch(child.info.run_id, tags=[RunTag(PARENT, run_id)])


def _discard_partial(client: MlflowClient, run: Run) -> None:
    """A delivery that failed half-way left this run: fail and delete it (MLflow keeps deleted
    runs restorable) and let a new one replace it."""
    for tag in (RECORD, PARTIAL_RECORD):
        if tag in run.data.tags:
            client.delete_tag(run.info.run_id, tag)
    client.set_terminated(run.info.run_id, RunStatus.FAILED)
    client.delete_run(run.info.run_id)


def _log_batch(client: MlflowClient, run_id: str, params: Mapping[str, str] | None = None,
               metrics: Mapping[str, float] | None = None, series: Mapping[str, list[list[float]]] | None = None,
               tags: Mapping[str, str] | None = None, timestamp: int = 0) -> None:
    from mlflow.entities import Metric, Param, RunTag

    points = [Metric(k, float(v), timestamp, 0) for k, v in (metrics or {}).items()]
    points += [Metric(k, float(v), timestamp, int(step))
               for k, values in (series or {}).items() for step, v in values]
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in (params or {}).items()],
                     tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
                     metrics=points[:MAX_METRICS_PER_BATCH])
    for start in range(MAX_METRICS_PER_BATCH, len(points), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=points[start:start + MAX_METRICS_PER_BATCH])
