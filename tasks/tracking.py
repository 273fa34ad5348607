"""MLflow, as shardflow uses it: where the tracking store is, delivering records, finding runs.

Plain functions over an ``MlflowClient``; no Prefect. The embedded default is a SQLite file in the
working directory with artifacts in ``./mlruns``; ``MLFLOW_TRACKING_URI`` (or a flow's
``tracking_uri``) points at a server instead.

A store that cannot be used — nothing answers, a SQLite file that is no database, damaged, locked
or read-only, a schema MLflow cannot migrate — is *tracking unavailable*: ``connect`` raises
``TrackingUnavailable`` with the reason in one line (``tracking_failure`` is the one place that
reads MLflow's, SQLAlchemy's, SQLite's and the HTTP client's exceptions), and records wait in the
outbox. The work itself never stops for it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlparse

from rec.errors import InputError, Problem, show
from rec.plan.io import PLAN_FILE, PLAN_FILES
from rec.settings import knob
from tasks.paths import DEFAULT_STATE_DIR, OUTBOX, in_work_dir, name_problems, outbox_dir, safe_dir_name, state_dir_in
from tasks.records import (
    PARENT,
    PARENT_RECORD,
    PARTIAL_RECORD,
    PLAN_ID,
    RECORD,
    SPEC_PATH,
    STEP,
    TOPOLOGY_HASH,
    EndRecord,
    RunRecord,
    RunStatus,
    RunStep,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

DEFAULT_DB = "mlflow.db"
DEFAULT_TRACKING_URI = f"sqlite:///{DEFAULT_DB}"
STORE_LOCK_SUFFIX = ".lock"  # mlflow.db.lock: held while a process opens (and may migrate) the store
DEFAULT_EXPERIMENT = "shardflow"
ARTIFACTS_DIR = "mlruns"  # next to a SQLite store: ARTIFACTS_DIR/<experiment>/...
MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
STORE_WAIT_S = 5.0  # how long a SQLite store locked by another process is waited for
# MLflow retries a failing server for minutes (7 times, exponential backoff) on every call; the
# outbox retries on the next delivery anyway. A user's own settings win.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
# MLflow's own output, which shardflow replaces with its one-line reports: progress bars of artifact
# transfers and "View run" links. Set wherever MLflow is used — the CLI, and flow runs that a Prefect
# worker or `shardflow serve` starts — unless SHARDFLOW_VERBOSE=1 (`-v`); a user's own settings win.
MLFLOW_QUIET_ENV = {
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # "🏃 View run ... 🧪 View experiment" on stdout
}
QUIET_LOGGERS = ("mlflow", "alembic")  # MLflow's INFO lines and its database migrations
MAX_REASON = 200  # characters of a failure's reason
# Log records carrying this attribute say that tracking is unavailable; the CLI says so itself,
# once, at the end (flows.logs hides them there).
TRACKING_WARNING = "shardflow_tracking_unavailable"


class TrackingUnavailable(ConnectionError):
    """MLflow cannot be reached, or its store cannot be used; records wait in the outbox."""


class RunNotFound(LookupError):
    """A record refers to a run MLflow does not have (yet)."""


@dataclass(frozen=True)
class Tracking:
    """Where runs go: the tracking URI, the experiment, and the outbox for when MLflow is away."""

    uri: str
    experiment: str = DEFAULT_EXPERIMENT
    outbox_dir: str = str(Path(DEFAULT_STATE_DIR, OUTBOX))


@dataclass(frozen=True)
class TrackingSettings:
    """Where runs and shardflow's own state go (the flags of every command that talks to MLflow,
    and the parameters of every flow): checked when made, so the CLI, the flows and deployment
    parameters all refuse the same names."""

    tracking_uri: str | None = field(default=None, metadata=knob(
        f"MLflow tracking URI; none: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI}", metavar="URI"))
    experiment: str = field(default=DEFAULT_EXPERIMENT, metadata=knob(
        f"MLflow experiment (a name: its artifacts go to a directory of that name, {ARTIFACTS_DIR}/NAME, "
        "next to a SQLite store)", metavar="NAME"))
    state_dir: str = field(default=DEFAULT_STATE_DIR, metadata=knob(
        "shardflow's own state: the outbox for MLflow and the plan cache", metavar="DIR"))
    # Only ``shardflow train`` offers --no-track; the flows always record.
    track: bool = field(default=True, metadata=knob(
        "record the run in MLflow (through the outbox when MLflow is away); --no-track: files only"))

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise InputError("Cannot record in MLflow with these settings:", problems)

    def problems(self) -> list[Problem]:
        """Every value that cannot be used: an experiment that is no plain name (it names a
        directory), a URI or state directory that is empty or holds control characters."""
        problems = [Problem(f"experiment {show(self.experiment)}", why) for why in name_problems(self.experiment)]
        for name, value in (("tracking URI", self.tracking_uri), ("state directory", self.state_dir)):
            if value is None:
                continue
            if not isinstance(value, str):
                problems.append(Problem(name, f"must be text, got {type(value).__name__}"))
            elif name == "state directory" and not value.strip():
                problems.append(Problem(name, "is empty"))
            elif not value.isprintable():
                problems.append(Problem(f"{name} {show(value)}", "contains control characters"))
        uri = self.tracking_uri
        if isinstance(uri, str) and uri.startswith("sqlite:///") and not uri.removeprefix("sqlite:///").strip():
            problems.append(Problem(f"tracking URI {show(uri)}", "names no database file"))
        return problems

    def resolve(self) -> Tracking:
        """The tracking URI (``MLFLOW_TRACKING_URI`` or SQLite in the working directory without one),
        the experiment and the outbox; paths made absolute."""
        return Tracking(resolve_uri(self.tracking_uri), self.experiment, outbox_dir(self.state_dir))

    def flow_parameters(self) -> dict[str, Any]:
        """The flows' parameters for these settings."""
        return {"tracking_uri": self.tracking_uri, "experiment": self.experiment, "state_dir": self.state_dir}


def tracking_for(uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT,
                 state_dir: str | None = DEFAULT_STATE_DIR, work_dir: str | None = None) -> Tracking:
    """``TrackingSettings(uri, experiment, state_dir).resolve()``: an InputError for names that
    cannot be used (the flows start with this). Without a ``uri`` (nor ``MLFLOW_TRACKING_URI``)
    or a ``state_dir``, the default ones are in ``work_dir`` (none: the working directory)."""
    if uri is None and work_dir and not os.environ.get("MLFLOW_TRACKING_URI"):
        uri = f"sqlite:///{in_work_dir(work_dir, DEFAULT_DB)}"
    return TrackingSettings(uri, experiment, state_dir_in(work_dir, state_dir)).resolve()


def resolve_uri(uri: str | None) -> str:
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    db = sqlite_path(uri)
    return f"sqlite:///{db.resolve()}" if db is not None else uri


def sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def artifact_location(db: Path, experiment: str) -> str:
    """Where a new experiment of a SQLite store keeps its artifacts: next to the database (not
    wherever the process runs), in a directory named for the experiment that stays inside
    ``mlruns`` whatever the name holds."""
    root = db.parent / ARTIFACTS_DIR
    location = root / safe_dir_name(experiment)
    assert location.parent == root, location  # safe_dir_name gives one plain path component
    return location.as_uri()


def tracking_failure(e: BaseException) -> str | None:
    """The reason, in one line, if ``e`` is MLflow or its store failing (MLflow, SQLAlchemy,
    SQLite, alembic, the HTTP client, the file system); None for anything else (a bug: let it
    raise). The innermost cause says it best ("file is not a database", "Connection refused")."""
    import alembic.util.exc
    import sqlalchemy.exc
    import urllib3.exceptions
    from mlflow.exceptions import MlflowException

    known = (MlflowException, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, alembic.util.exc.CommandError,
             urllib3.exceptions.HTTPError, OSError, RunNotFound)
    chain = _chain(e)
    if not any(isinstance(x, known) for x in chain):
        return None
    innermost = [x for x in chain if isinstance(x, known)][-1]
    return one_line(innermost)


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = e
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return out


def one_line(e: BaseException) -> str:
    """An exception's message on one line, without SQLAlchemy's SQL dump or "[Errno N]"."""
    if isinstance(e, OSError) and e.strerror:
        text = f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    else:
        noise = ("[SQL", "[param", "(Background")  # SQLAlchemy's statement dump
        lines = [line for line in str(e).splitlines() if line.strip() and not line.startswith(noise)]
        text = lines[0] if lines else type(e).__name__
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


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


def check_store(uri: str) -> None:
    """TrackingUnavailable, in a moment, for a store MLflow could not use: nothing answers at a
    server's address; a SQLite file that is no database, is damaged, locked past STORE_WAIT_S, or
    cannot be written (a write is tried, and rolled back). MLflow itself would retry such a file
    for 100 s, or log a traceback per call."""
    if not reachable(uri):
        raise TrackingUnavailable("nothing answers at this address")
    db = sqlite_path(uri)
    if db is None or "?" in str(db):  # a server, or SQLite with driver options: MLflow's to open
        return
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        if db.is_dir():
            raise TrackingUnavailable(f"{db} is a directory, not a database file")
        with closing(sqlite3.connect(f"file:{quote(str(db))}?mode=rwc", uri=True, timeout=STORE_WAIT_S,
                                     isolation_level=None)) as con:
            version = int(con.execute("PRAGMA user_version").fetchone()[0])
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            con.execute("BEGIN IMMEDIATE")
            con.execute(f"PRAGMA user_version = {version}")
            con.execute("ROLLBACK")
    except (sqlite3.Error, OSError) as e:
        raise TrackingUnavailable(one_line(e)) from e


def connect(tracking: Tracking) -> tuple[MlflowClient, str]:
    """A client and the experiment id (created if missing); TrackingUnavailable, with the reason,
    if the store cannot be used."""
    check_store(tracking.uri)
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from mlflow import MlflowClient

    quiet_mlflow()  # after MLflow's import, which sets up its loggers

    db = sqlite_path(tracking.uri)
    try:
        with _setting_up(db):
            client = MlflowClient(tracking.uri)  # a SQLite store opens (and may fail) right here
            experiment = client.get_experiment_by_name(tracking.experiment)
            if experiment is None:
                location = artifact_location(db, tracking.experiment) if db is not None else None
                try:
                    return client, client.create_experiment(tracking.experiment, artifact_location=location)
                except Exception:  # created meanwhile by another process (a server has no lock of ours)
                    experiment = client.get_experiment_by_name(tracking.experiment)
                    if experiment is None:
                        raise
            if experiment.lifecycle_stage != "active":
                raise TrackingUnavailable(f"experiment {tracking.experiment!r} is deleted: restore it "
                                          "(mlflow experiments restore) or use another --experiment")
            return client, experiment.experiment_id
    except TrackingUnavailable:
        raise
    except Exception as e:
        why = tracking_failure(e)
        if why is None:
            raise
        raise TrackingUnavailable(why) from e


@contextmanager
def _setting_up(db: Path | None) -> Iterator[None]:
    """One process at a time opens a SQLite store: MLflow creates and migrates the schema on first
    use, and two processes doing that at once leave it half-migrated ("table _alembic_tmp_... already
    exists") for good. The lock file sits beside the database; where it cannot be made, no lock."""
    if db is None:
        yield
        return
    try:
        handle = open(db.with_name(f"{db.name}{STORE_LOCK_SUFFIX}"), "a")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def quiet_mlflow() -> None:
    """MLflow without its progress bars, links and log lines (``MLFLOW_QUIET_ENV``, ``QUIET_LOGGERS``),
    unless SHARDFLOW_VERBOSE=1: shardflow reports what a person needs of MLflow itself."""
    import logging

    from tasks.launch import verbose

    if verbose():
        return
    for key, value in MLFLOW_QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if "MLFLOW_LOGGING_LEVEL" not in os.environ:
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)


def store_problem(client: MlflowClient, experiment_id: str, uri: str) -> str | None:
    """Why the store fails as a whole right now (None if it works): after a record failed, this
    tells a store that went away from a record MLflow does not take."""
    try:
        check_store(uri)
        client.get_experiment(experiment_id)
    except TrackingUnavailable as e:
        return str(e)
    except Exception as e:
        why = tracking_failure(e)
        if why is None:
            raise
        return why
    return None


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
        return run.info.run_id
    existing = run_of_record(client, experiment_id, record.key)
    if existing is not None:
        if record.status == RunStatus.RUNNING or existing.info.status == record.status:
            _link_children(client, experiment_id, record.key, existing.info.run_id)
            return existing.info.run_id
        _discard_partial(client, existing)
    for partial in client.search_runs([experiment_id], f"tags.`{PARTIAL_RECORD}` = '{_quote(record.key)}'"):
        _discard_partial(client, partial)
    if record.unique_plan:
        same = [run for run in find_runs(client, [experiment_id], step=RunStep.PLAN, plan_id=record.tags[PLAN_ID],
                                         finished=True, max_results=10) if RECORD in run.data.tags]
        if same:
            return same[0].info.run_id
    tags = {**record.tags, STEP: record.step, PARTIAL_RECORD: record.key}
    if record.parent_key:
        tags[PARENT_RECORD] = record.parent_key
        parent = run_of_record(client, experiment_id, record.parent_key)
        if parent is not None:
            tags[PARENT] = parent.info.run_id
    run = client.create_run(experiment_id, start_time=record.start_ms, tags=tags, run_name=record.name)
    run_id = run.info.run_id
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

    for child in client.search_runs([experiment_id], f"tags.`{PARENT_RECORD}` = '{_quote(key)}'"):
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
    runs = client.search_runs([experiment_id], f"tags.`{RECORD}` = '{_quote(key)}'", max_results=1)
    return runs[0] if runs else None


def find_runs(client: MlflowClient, experiment_ids: list[str], step: RunStep | None = None,
              finished: bool = False, max_results: int = 1000, **tags: str) -> list[Run]:
    """Runs newest first, filtered by ``shardflow.<name>`` tags (e.g. ``plan_id=...``)."""
    clauses = [f"tags.`{STEP}` = '{step}'"] if step else []
    clauses += [f"tags.`shardflow.{name}` = '{_quote(value)}'" for name, value in tags.items()]
    if finished:
        clauses.append(f"attributes.status = '{RunStatus.FINISHED}'")
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
        f" and attributes.status = '{RunStatus.FINISHED}'",
        max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0] if runs else None


def download_plan(client: MlflowClient, experiment_id: str, plan_id: str, dest: Path) -> Path | None:
    """plan.json and shards.parquet of the finished plan run of ``plan_id`` into ``dest``."""
    runs = find_runs(client, [experiment_id], step=RunStep.PLAN, plan_id=plan_id, finished=True,
                     max_results=1)
    if not runs:
        return None
    dest.mkdir(parents=True, exist_ok=True)
    run_id = runs[0].info.run_id
    for name in PLAN_FILES:
        client.download_artifacts(run_id, name, str(dest))
    return dest / PLAN_FILE
