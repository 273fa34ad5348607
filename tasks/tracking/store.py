"""Whether an MLflow store can be used, and opening it: one process at a time for a SQLite file.

A store that cannot be used — nothing answers, a SQLite file that is no database, damaged, locked
or read-only, a schema MLflow cannot migrate — is *tracking unavailable*: ``connect`` raises
``TrackingUnavailable`` with the reason in one line (``tracking_failure`` is the one place that
reads MLflow's, SQLAlchemy's, SQLite's and the HTTP client's exceptions), and records wait in the
outbox. The work itself never stops for it.
"""

from __future__ import annotations

import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlparse

from rec.file_lock import file_lock, holding, open_lock_file, take
from tasks.paths import safe_dir_name
from tasks.tracking.settings import ARTIFACTS_DIR, Tracking, not_a_file_store, sqlite_path, sqlite_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient

STORE_LOCK_SUFFIX = ".lock"  # mlflow.db.lock: held while a process opens (and may migrate) the store
PLAN_RUNS_LOCK_SUFFIX = ".plan-runs.lock"  # mlflow.db.plan-runs.lock: held while a plan run is delivered
# .mlflow.db.new-PID-XXXXXXXX: a new store MLflow sets up beside its path, moved there once whole
NEW_STORE_FILE = ".{name}.new-{pid}-{token}"
SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm")  # SQLite's files beside a database
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
    driver = next((x for x in chain if isinstance(x, ImportError) and _in_a_dialect(x)), None)
    if driver is not None:  # e.g. mysql:// without MySQLdb: SQLAlchemy imports the driver when the store opens
        return (f"the store's database driver is not installed here (no module {driver.name!r}): install it "
                "beside MLflow, or use another --tracking-uri")
    if not any(isinstance(x, known) for x in chain):
        return None
    innermost = [x for x in chain if isinstance(x, known)][-1]
    return one_line(innermost)


def _in_a_dialect(e: ImportError) -> bool:
    """``e`` was raised while SQLAlchemy's dialect for a database imported its driver."""
    import traceback

    return any(f"sqlalchemy{os.sep}dialects" in frame.filename for frame in traceback.extract_tb(e.__traceback__))


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
    server's address; a SQLite file that is no database, is damaged, locked past STORE_WAIT_S, holds
    tables none of which is MLflow's (someone else's database, which MLflow would add its own to), or
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
            tables = table_names(con)
            if tables and not tables & mlflow_tables():  # someone else's database: MLflow would add its tables
                shown = ", ".join(sorted(tables)[:3]) + (", ..." if len(tables) > 3 else "")
                raise TrackingUnavailable(f"{db} is not an MLflow store (it holds other tables: {shown}): name a "
                                          "new file or an MLflow store")
            con.execute("BEGIN IMMEDIATE")
            con.execute(f"PRAGMA user_version = {version}")
            con.execute("ROLLBACK")
    except (sqlite3.Error, OSError) as e:
        raise TrackingUnavailable(one_line(e)) from e


def check_readable(uri: str) -> None:
    """TrackingUnavailable, in one line, unless ``uri`` names a store MLflow reads as it is: a
    command that only reads never creates, migrates or writes one. A SQLite file must exist and
    hold every table of MLflow's schema (else MLflow would make or migrate them) and its default
    experiment (else MLflow would add it); it is looked at through a read-only connection. A file
    store (a path or ``file:`` URI) must be a directory holding MLflow's default experiment. A
    server only has to answer."""
    if not reachable(uri):
        raise TrackingUnavailable("nothing answers at this address")
    db = sqlite_path(uri)
    if db is not None:
        if "?" not in str(db):  # with driver options: MLflow's to open
            _check_sqlite_store(db)
        return
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        root = Path(parsed.path if parsed.scheme else uri)
        if root.is_file():
            raise TrackingUnavailable(f"{root} {not_a_file_store(root)}")
        if not root.is_dir():
            raise TrackingUnavailable(f"no MLflow store at {root} (a command that records makes one)")
        if not any((root / where / "meta.yaml").is_file() for where in ("0", ".trash/0")):
            raise TrackingUnavailable(f"{root} is not an MLflow store (no experiment 0 in it)")


def _check_sqlite_store(db: Path) -> None:
    if not db.is_file():
        raise TrackingUnavailable(f"no MLflow store at {db} (a command that records makes one)")
    with _not_being_set_up(db):
        _check_sqlite_tables(db)


@contextmanager
def one_plan_run_at_a_time(uri: str) -> Iterator[None]:
    """Around a plan run's delivery, from its check that the plan has no run yet to its run's being
    complete: two commands delivering one plan at once (two pipelines of one spec, a scheduled replan
    beside `shardflow run`) each saw none and made one. A lock beside a SQLite store, gone when let go;
    nothing for another kind of store (a server: its deliveries may still race, rarely)."""
    db = sqlite_path(uri)
    with ExitStack() as stack:
        if db is not None:
            with suppress(OSError):  # no lock file can be made there: as for a server
                stack.enter_context(file_lock(db.with_name(f"{db.name}{PLAN_RUNS_LOCK_SUFFIX}"), removed=True))
        yield


@contextmanager
def _not_being_set_up(db: Path) -> Iterator[None]:
    """While another process sets the store up (``_setting_up``: MLflow making or migrating its
    tables), wait for it, up to STORE_WAIT_S: a store half made read as no MLflow store, or as an
    older MLflow's, to be upgraded by hand beside the migration running. Held shared while the reader
    checks; a read-only command makes no lock file where there is none."""
    try:
        fd = os.open(db.with_name(f"{db.name}{STORE_LOCK_SUFFIX}"),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # none (no process set it up from here), or not a file shardflow made
        yield
        return
    try:
        deadline = time.monotonic() + STORE_WAIT_S
        while True:
            try:
                take(fd, shared=True, blocking=False)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TrackingUnavailable(f"{db} is being set up by another process (its lock "
                                              f"{db.name}{STORE_LOCK_SUFFIX} is held): try again in a moment") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def read_only(db: Path) -> closing[sqlite3.Connection]:
    """A read-only connection to the SQLite file ``db`` (waiting up to ``STORE_WAIT_S`` for a writer),
    closed by the block it opens."""
    return closing(sqlite3.connect(f"file:{quote(str(db))}?mode=ro", uri=True, timeout=STORE_WAIT_S))


def table_names(con: sqlite3.Connection) -> set[str]:
    return {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _check_sqlite_tables(db: Path) -> None:
    try:
        with read_only(db) as con:
            tables = table_names(con)
            if not {"alembic_version", "experiments"} <= tables:
                raise TrackingUnavailable(f"{db} is not an MLflow store (it has no MLflow tables)")
            missing = sorted(mlflow_tables() - tables)
            interrupted = _interrupted_setup(db, con, tables)
            if interrupted:
                raise TrackingUnavailable(interrupted)
            if missing:
                raise TrackingUnavailable(f"{db} was made by an older MLflow (no table {missing[0]}): "
                                          "upgrade it (mlflow db upgrade) or record a run first")
            if con.execute("SELECT 1 FROM experiments WHERE experiment_id = 0").fetchone() is None:
                raise TrackingUnavailable(f"{db} lacks MLflow's default experiment: MLflow would add it")
    except sqlite3.Error as e:
        raise TrackingUnavailable(one_line(e)) from e


def _interrupted_setup(db: Path, con: sqlite3.Connection, tables: set[str]) -> str | None:
    """Why ``db`` cannot be used, if MLflow's first setup of it stopped midway (a full disk, a
    killed process; by a shardflow that set stores up in place): some of MLflow's tables are missing
    and there is no experiment at all, not even the default one MLflow adds once its migrations are
    done, so nothing was ever recorded in it. Upgrading it fails ("table ... already exists"): the
    migration that stopped made some of its tables, and alembic's version was not moved past it."""
    if not {"alembic_version", "experiments"} <= tables or not mlflow_tables() - tables:
        return None
    if con.execute("SELECT 1 FROM experiments LIMIT 1").fetchone() is not None:
        return None
    row = con.execute("SELECT version_num FROM alembic_version LIMIT 1").fetchone()
    version = row[0] if row else "none"
    missing = len(mlflow_tables() - tables)
    return (f"its first setup was interrupted (alembic version {version}, {missing} of MLflow's tables missing, no "
            f"experiment): remove {db}, which holds no runs, to have it set up afresh")


def mlflow_tables() -> set[str]:
    """The tables of the installed MLflow's schema: where one is missing, MLflow makes (migrates) them."""
    import mlflow.store.db.utils  # noqa: F401  (registers every model's table)
    from mlflow.store.db.base_sql_model import Base

    return set(Base.metadata.tables)


def open_read_only(tracking: Tracking) -> tuple[MlflowClient, str | None]:
    """A client and the experiment's id (None: no such experiment yet), for commands that only
    read: nothing is created or written (``check_readable``; no lock file, no experiment made)."""
    check_readable(tracking.uri)
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from mlflow import MlflowClient

    quiet_mlflow()
    try:
        client = MlflowClient(tracking.uri)
        experiment = client.get_experiment_by_name(tracking.experiment)
    except Exception as e:
        why = tracking_failure(e)
        if why is None:
            raise
        raise TrackingUnavailable(why) from e
    return client, None if experiment is None else str(experiment.experiment_id)


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
        with _setting_up(db) as locked:
            if db is not None and "?" not in str(db):
                if locked and not db.is_symlink() and not _tables(db):  # a link stays, and MLflow sets up its file
                    _set_up_aside(db, tracking.experiment)
                else:
                    _refuse_interrupted_setup(db)
            client = MlflowClient(tracking.uri)  # a SQLite store opens (and may fail) right here
            experiment = client.get_experiment_by_name(tracking.experiment)
            if experiment is None:
                location = artifact_location(db, tracking.experiment) if db is not None else None
                try:
                    return client, str(client.create_experiment(tracking.experiment, artifact_location=location))
                except Exception:  # created meanwhile by another process (a server has no lock of ours)
                    experiment = client.get_experiment_by_name(tracking.experiment)
                    if experiment is None:
                        raise
            if experiment.lifecycle_stage != "active":
                raise TrackingUnavailable(f"experiment {tracking.experiment!r} is deleted: restore it "
                                          "(mlflow experiments restore) or use another --experiment")
            return client, str(experiment.experiment_id)
    except TrackingUnavailable:
        raise
    except Exception as e:
        why = tracking_failure(e)
        if why is None:
            raise
        raise TrackingUnavailable(why) from e


@contextmanager
def _setting_up(db: Path | None) -> Iterator[bool]:
    """One process at a time opens a SQLite store: MLflow creates and migrates the schema on first
    use, and two processes doing that at once leave it half-migrated ("table _alembic_tmp_... already
    exists") for good. The lock file sits beside the database; where it cannot be made, no lock
    (yields whether it is held)."""
    with ExitStack() as stack:
        locked = False
        if db is not None:
            try:
                fd = open_lock_file(db.with_name(f"{db.name}{STORE_LOCK_SUFFIX}"))
            except OSError:
                pass
            else:
                stack.enter_context(holding(fd))
                locked = True
        yield locked


def _tables(db: Path) -> set[str]:
    """The tables of the SQLite file ``db`` (none: no file, or an empty one, as ``check_store``
    leaves a new store's path)."""
    if not db.is_file() or db.stat().st_size == 0:
        return set()
    with read_only(db) as con:
        return table_names(con)


def _refuse_interrupted_setup(db: Path) -> None:
    """TrackingUnavailable, saying how to get out, for a store whose first setup stopped midway:
    MLflow would fail on it every time ("table ... already exists")."""
    if not db.is_file():
        return
    with read_only(db) as con:
        tables = table_names(con)
        interrupted = _interrupted_setup(db, con, tables)
    if interrupted:
        raise TrackingUnavailable(interrupted)


def _set_up_aside(db: Path, experiment: str) -> None:
    """A new SQLite store, set up under a name of its own beside ``db`` (MLflow's migrations, its
    default experiment and ``experiment``) and moved to ``db`` once whole: a setup that fails midway
    (a full disk, a killed process) leaves no store half migrated for good, only no store, which the
    next command sets up afresh. Called with the setup lock held."""
    from mlflow import MlflowClient

    # Its own name (O_EXCL: never another process's), with the permissions SQLite would give it.
    aside = db.with_name(NEW_STORE_FILE.format(name=db.name, pid=os.getpid(), token=secrets.token_hex(4)))
    try:
        os.close(os.open(aside, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    except OSError:  # no file can be made beside it (the directory is not ours): MLflow sets it up in place
        return
    uri = sqlite_uri(aside)
    try:
        try:
            MlflowClient(uri).create_experiment(experiment, artifact_location=artifact_location(db, experiment))
        finally:
            _dispose_engine(uri)
        os.replace(aside, db)
    except BaseException:
        for path in (aside, *(aside.with_name(aside.name + side) for side in SQLITE_SIDE_FILES)):
            path.unlink(missing_ok=True)
        if db.is_file() and db.stat().st_size == 0:  # as check_store left it: no store rather than an empty file
            db.unlink(missing_ok=True)
        raise


def _dispose_engine(uri: str) -> None:
    """Close the connections MLflow keeps open to ``uri``'s database (a class-wide cache of engines
    by URI): the set-up store is used under its final path from then on."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engine = getattr(SqlAlchemyStore, "_engine_map", {}).pop(uri, None)
    if engine is not None:
        engine.dispose()


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
