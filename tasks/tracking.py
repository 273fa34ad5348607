"""MLflow, as shardflow uses it: where the tracking store is, delivering records, finding runs.

Plain functions over an ``MlflowClient``; no Prefect. The embedded default is a SQLite file in the
working directory with artifacts in ``./mlruns``; ``MLFLOW_TRACKING_URI`` (or a flow's
``tracking_uri``) points at a server instead.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from rec.errors import InputError, Problem
from rec.settings import knob
from tasks.paths import DEFAULT_STATE_DIR, OUTBOX, outbox_dir
from tasks.records import PARENT, PLAN_ID, RECORD, SPEC_PATH, STEP, TOPOLOGY_HASH, EndRecord, RunRecord

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "shardflow"
MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit


class TrackingUnavailable(ConnectionError):
    """MLflow cannot be reached (or refused a write); records wait in the outbox."""


@dataclass(frozen=True)
class Tracking:
    """Where runs go: the tracking URI, the experiment, and the outbox for when MLflow is away."""

    uri: str
    experiment: str = DEFAULT_EXPERIMENT
    outbox_dir: str = str(Path(DEFAULT_STATE_DIR, OUTBOX))


@dataclass(frozen=True)
class TrackingSettings:
    """Where runs and shardflow's own state go (the flags of every command that talks to MLflow)."""

    tracking_uri: str | None = field(default=None, metadata=knob(
        f"MLflow tracking URI; none: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI}", metavar="URI"))
    experiment: str = field(default=DEFAULT_EXPERIMENT, metadata=knob("MLflow experiment", metavar="NAME"))
    state_dir: str = field(default=DEFAULT_STATE_DIR, metadata=knob(
        "shardflow's own state: the outbox for MLflow and the plan cache", metavar="DIR"))
    # Only ``shardflow train`` offers --no-track; the flows always record.
    track: bool = field(default=True, metadata=knob(
        "record the run in MLflow (through the outbox when MLflow is away); --no-track: files only"))

    def resolve(self) -> Tracking:
        return tracking_for(self.tracking_uri, self.experiment, self.state_dir)

    def flow_parameters(self) -> dict[str, Any]:
        """The flows' parameters for these settings."""
        return {"tracking_uri": self.tracking_uri, "experiment": self.experiment, "state_dir": self.state_dir}


def tracking_for(uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT,
                 state_dir: str = DEFAULT_STATE_DIR) -> Tracking:
    """``uri`` or ``MLFLOW_TRACKING_URI`` or SQLite in the working directory; paths made absolute."""
    return Tracking(resolve_uri(uri), experiment, outbox_dir(state_dir))


def resolve_uri(uri: str | None) -> str:
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    db = sqlite_path(uri)
    return f"sqlite:///{db.resolve()}" if db is not None else uri


def sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def reachable(uri: str, timeout_s: float = 3.0) -> bool:
    """A quick TCP check for servers: MLflow's client retries a dead server for minutes."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return True
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def connect(tracking: Tracking) -> tuple[MlflowClient, str]:
    """A client and the experiment id (created if missing); TrackingUnavailable if unreachable."""
    if not reachable(tracking.uri):
        raise TrackingUnavailable(f"nothing answers at {tracking.uri}")
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient(tracking.uri)  # a SQLite store opens (and may fail) right here
        experiment = client.get_experiment_by_name(tracking.experiment)
        if experiment is not None:
            return client, experiment.experiment_id
        db = sqlite_path(tracking.uri)
        # Next to the database, not wherever the process happens to run.
        location = (db.parent / "mlruns" / tracking.experiment).as_uri() if db is not None else None
        return client, client.create_experiment(tracking.experiment, artifact_location=location)
    except (MlflowException, OSError) as e:
        raise TrackingUnavailable(f"{tracking.uri}: {e}") from e


def deliver(client: MlflowClient, experiment_id: str, record: RunRecord | EndRecord,
            files: Path) -> str:
    """Log ``record`` (artifacts from ``files``); returns the run id. Safe to repeat."""
    if isinstance(record, EndRecord):
        run = run_of_record(client, experiment_id, record.key)
        if run is None:
            raise LookupError(f"no run for record {record.key} to finish")
        _log_batch(client, run.info.run_id, tags=record.tags)
        client.set_terminated(run.info.run_id, record.status, end_time=record.end_ms)
        return run.info.run_id
    existing = run_of_record(client, experiment_id, record.key)
    if existing is not None:
        if record.status == "RUNNING" or existing.info.status == record.status:
            return existing.info.run_id
        _discard_partial(client, existing)
    if record.unique_plan:
        same = find_runs(client, [experiment_id], step="plan", plan_id=record.tags[PLAN_ID],
                         finished=True, max_results=1)
        if same:
            return same[0].info.run_id
    tags = {**record.tags, STEP: record.step, RECORD: record.key}
    if record.parent_key:
        parent = run_of_record(client, experiment_id, record.parent_key)
        if parent is not None:
            tags[PARENT] = parent.info.run_id
    run_id = client.create_run(experiment_id, start_time=record.start_ms, tags=tags,
                               run_name=record.name).info.run_id
    _log_batch(client, run_id, params=record.params, metrics=record.metrics,
               series=record.series, timestamp=record.end_ms or record.start_ms)
    for name in record.artifacts:
        if (files / name).exists():
            folder = str(Path(name).parent)
            client.log_artifact(run_id, str(files / name), None if folder == "." else folder)
    if record.status != "RUNNING":
        client.set_terminated(run_id, record.status, end_time=record.end_ms)
    return run_id


def _discard_partial(client: MlflowClient, run: Run) -> None:
    """A delivery that died half-way left this run: fail it and let a new one replace it."""
    client.delete_tag(run.info.run_id, RECORD)
    client.set_terminated(run.info.run_id, "FAILED")


def _log_batch(client: MlflowClient, run_id: str, params: dict | None = None,
               metrics: dict | None = None, series: dict | None = None, tags: dict | None = None,
               timestamp: int = 0) -> None:
    from mlflow.entities import Metric, Param, RunTag

    points = [Metric(k, float(v), timestamp, 0) for k, v in (metrics or {}).items()]
    points += [Metric(k, float(v), timestamp, int(step))
               for k, values in (series or {}).items() for step, v in values]
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in (params or {}).items()],
                     tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
                     metrics=points[:MAX_METRICS_PER_BATCH])
    for start in range(MAX_METRICS_PER_BATCH, len(points), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=points[start:start + MAX_METRICS_PER_BATCH])


def run_of_record(client: MlflowClient, experiment_id: str, key: str) -> Run | None:
    runs = client.search_runs([experiment_id], f"tags.`{RECORD}` = '{key}'", max_results=1)
    return runs[0] if runs else None


def find_runs(client: MlflowClient, experiment_ids: list[str], step: str | None = None,
              finished: bool = False, max_results: int = 1000, **tags: str) -> list[Run]:
    """Runs newest first, filtered by ``shardflow.<name>`` tags (e.g. ``plan_id=...``)."""
    clauses = [f"tags.`{STEP}` = '{step}'"] if step else []
    clauses += [f"tags.`shardflow.{name}` = '{_quote(value)}'" for name, value in tags.items()]
    if finished:
        clauses.append("attributes.status = 'FINISHED'")
    return list(client.search_runs(experiment_ids, " and ".join(clauses),
                                   max_results=max_results, order_by=["attributes.start_time DESC"]))


def _quote(value: str) -> str:
    if "'" in value:
        raise InputError("Cannot search MLflow for this value:", [Problem(value, "contains a quote")])
    return value


def last_planning(client: MlflowClient, experiment_id: str, spec_path: str,
                  topology_hash: str) -> Run | None:
    """The newest finished run that planned this spec file on this topology (plan, pipeline or
    replan: all carry ``shardflow.spec_hash``)."""
    runs = client.search_runs(
        [experiment_id],
        f"tags.`{SPEC_PATH}` = '{_quote(spec_path)}' and tags.`{TOPOLOGY_HASH}` = '{topology_hash}'"
        " and attributes.status = 'FINISHED'",
        max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0] if runs else None


def download_plan(client: MlflowClient, experiment_id: str, plan_id: str, dest: Path) -> Path | None:
    """plan.json and shards.parquet of the finished plan run of ``plan_id`` into ``dest``."""
    runs = find_runs(client, [experiment_id], step="plan", plan_id=plan_id, finished=True,
                     max_results=1)
    if not runs:
        return None
    dest.mkdir(parents=True, exist_ok=True)
    run_id = runs[0].info.run_id
    for name in ("plan.json", "shards.parquet"):
        client.download_artifacts(run_id, name, str(dest))
    return dest / "plan.json"
