"""Where runs go: the tracking URI, the experiment and the outbox, as the user names them
(``TrackingSettings``: flags and flow parameters) and resolved (``Tracking``).

The embedded default is a SQLite file in the working directory (``mlflow.db``) with artifacts in
``./mlruns``; ``MLFLOW_TRACKING_URI`` (or ``--tracking-uri``, a flow's ``tracking.tracking_uri``)
points at a server instead, as ``MLFLOW_EXPERIMENT_NAME`` (or ``--experiment``) names the experiment.
What the environment gives is checked as the flags are, in the environment of the process that
records (a flow run's own, for a deployment).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from rec.errors import InputError, Problem, printable, show
from rec.settings import knob
from tasks.paths import (
    DEFAULT_STATE_DIR,
    OUTBOX,
    in_work_dir,
    name_problems,
    outbox_dir,
    state_dir_in,
    state_problems,
)

SQLITE_SCHEME = "sqlite:///"  # a SQLite store's URI: the scheme, then the database file's path
DEFAULT_DB = "mlflow.db"
DEFAULT_EXPERIMENT = "shardflow"
ARTIFACTS_DIR = "mlruns"  # next to a SQLite store: ARTIFACTS_DIR/<experiment>/...
URI_ENV = "MLFLOW_TRACKING_URI"  # MLflow's own variables for what --tracking-uri and --experiment say
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"


def sqlite_uri(db: str | Path) -> str:
    """The tracking URI of the SQLite database file ``db``."""
    return f"{SQLITE_SCHEME}{db}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a SQLite tracking URI; None for any other URI."""
    return Path(uri.removeprefix(SQLITE_SCHEME)) if uri.startswith(SQLITE_SCHEME) else None


DEFAULT_TRACKING_URI = sqlite_uri(DEFAULT_DB)


@dataclass(frozen=True)
class Tracking:
    """Where runs go: the tracking URI, the experiment, and the outbox for when MLflow is away."""

    uri: str
    experiment: str = DEFAULT_EXPERIMENT
    outbox_dir: str = str(Path(DEFAULT_STATE_DIR, OUTBOX))

    @property
    def client_modules(self) -> tuple[str, ...]:
        """The modules recording here loads (seconds of imports; a caller may load them early)."""
        sqlite = ("mlflow.store.tracking.sqlalchemy_store",) if self.uri.startswith(SQLITE_SCHEME) else ()
        return ("mlflow", *sqlite)


@dataclass(frozen=True)
class TrackingSettings:
    """Where runs and shardflow's own state go (the flags of every command that talks to MLflow,
    and the parameters of every flow): checked when made, so the CLI, the flows and deployment
    parameters all refuse the same names."""

    tracking_uri: str | None = field(default=None, metadata=knob(
        f"MLflow tracking URI; none: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI}", metavar="URI"))
    experiment: str | None = field(default=None, metadata=knob(
        f"MLflow experiment (a name: its artifacts go to a directory of that name, {ARTIFACTS_DIR}/NAME, "
        f"next to a SQLite store); none: ${EXPERIMENT_ENV} or {DEFAULT_EXPERIMENT}", metavar="NAME"))
    state_dir: str = field(default=DEFAULT_STATE_DIR, metadata=knob(
        "shardflow's own state: the outbox for MLflow and the plan cache", metavar="DIR", path=True))
    # The commands offer --no-track (plan, train, measure); the flows always record (they refuse false).
    track: bool = field(default=True, metadata=knob(
        "record the run in MLflow (through the outbox when MLflow is away); --no-track: files only"))

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise InputError("Cannot use MLflow with these settings:", problems)

    def problems(self) -> list[Problem]:
        """Every value that cannot be used: an experiment that is no plain name (it names a
        directory), a URI or state directory that is empty or holds control characters. What the
        environment gives in their place is checked where they are resolved (``resolve``): the flows'
        default settings are made as their modules are imported, before any flag is read."""
        problems = [] if self.experiment is None else \
            [Problem(f"experiment {show(self.experiment)}", why) for why in name_problems(self.experiment)]
        for name, value in (("tracking URI", self.tracking_uri), ("state directory", self.state_dir)):
            if value is None:
                continue
            if not isinstance(value, str):
                problems.append(Problem(name, f"must be text, got {type(value).__name__}"))
            elif name == "state directory" and not value.strip():
                problems.append(Problem(name, "is empty"))
            elif not value.isprintable():
                problems.append(Problem(f"{name} {show(value)}", "contains control characters"))
        if isinstance(self.state_dir, str) and self.state_dir.strip() and self.state_dir.isprintable():
            problems += state_problems(self.state_dir)
        uri = self.tracking_uri
        if isinstance(uri, str) and uri.isprintable():
            problems += [Problem(f"tracking URI {show(uri)}", why) for why in uri_problems(uri)]
        if self.track and not problems:
            problems += sqlite_path_problems(resolve_uri(uri))
        return problems

    def resolve(self) -> Tracking:
        """The tracking URI (``MLFLOW_TRACKING_URI`` or SQLite in the working directory without one),
        the experiment (``MLFLOW_EXPERIMENT_NAME`` or ``DEFAULT_EXPERIMENT`` without one) and the
        outbox; paths made absolute. Where runs are recorded, an InputError naming what the
        environment gives that cannot be recorded with (``environment_problems``); a command resolves
        its settings before its work, a flow as it starts (``tracking_for``)."""
        if self.track:
            problems = environment_problems(uri=self.tracking_uri is None, experiment=self.experiment is None)
            if problems:
                raise InputError("Cannot use MLflow with these settings:", problems)
        return Tracking(resolve_uri(self.tracking_uri), resolve_experiment(self.experiment),
                        outbox_dir(self.state_dir))


def resolve_experiment(experiment: str | None) -> str:
    """The experiment runs go to: ``experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else ``DEFAULT_EXPERIMENT``."""
    return experiment or os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT


def environment_problems(uri: bool = True, experiment: bool = True) -> list[Problem]:
    """Why what the environment sets cannot be recorded with, each naming its variable: the
    ``MLFLOW_TRACKING_URI`` (``uri``: no URI was given) and ``MLFLOW_EXPERIMENT_NAME``
    (``experiment``: none was given) that will be used, checked as the flags are; and any of MLflow's
    own variables MLflow cannot read (``mlflow_variable_problems``)."""
    problems = []
    if uri and (value := os.environ.get(URI_ENV)):
        where = f"{URI_ENV}={printable(value, 80)}"
        reasons = uri_problems(value) if value.isprintable() else ["contains control characters"]
        problems += [Problem(where, why) for why in reasons]
    if experiment and (value := os.environ.get(EXPERIMENT_ENV)):
        problems += [Problem(f"{EXPERIMENT_ENV}={printable(value, 60)}", why) for why in name_problems(value)]
    return problems + mlflow_variable_problems()


# What MLflow reads each type of its variables as (mlflow.environment_variables), for a message.
_KINDS = {int: "a whole number", float: "a number", bool: "true, false, 1 or 0"}


def mlflow_variable_problems() -> list[Problem]:
    """MLflow's own variables (``mlflow.environment_variables``) set to a value MLflow cannot read as
    its type, e.g. ``MLFLOW_HTTP_REQUEST_TIMEOUT=abc``: MLflow raises on the first call that reads one,
    which is after the work, as its run is recorded."""
    if not any(name.startswith("MLFLOW_") for name in os.environ):
        return []
    problems = []
    for variable in _mlflow_variables():
        raw = os.environ.get(variable.name)
        if not raw:  # unset, or emptied (`export MLFLOW_X=`): MLflow's default, as far as shardflow can tell
            continue
        try:
            variable.get()
        except ValueError:
            kind = _KINDS.get(variable.type, getattr(variable.type, "__name__", "its type"))
            problems.append(Problem(f"{variable.name}={printable(raw, 60)}",
                                    f"MLflow reads this variable as {kind}: set it so, or unset it"))
    return problems


@lru_cache(maxsize=1)
def _mlflow_variables() -> tuple[Any, ...]:
    """The variables ``mlflow.environment_variables`` defines. Its file is run on its own where MLflow
    is not imported yet: it imports nothing of MLflow's, and importing MLflow takes seconds that
    ``shardflow plan`` otherwise never spends."""
    module = sys.modules.get("mlflow.environment_variables")
    if module is None:
        from importlib.util import find_spec, module_from_spec, spec_from_file_location

        package = find_spec("mlflow")
        if package is None or not package.submodule_search_locations:
            return ()
        path = Path(next(iter(package.submodule_search_locations)), "environment_variables.py")
        spec = spec_from_file_location("_shardflow_mlflow_environment_variables", path)
        if spec is None or spec.loader is None:
            return ()
        module = module_from_spec(spec)
        spec.loader.exec_module(module)
    base = getattr(module, "_EnvironmentVariable", None)
    return tuple(v for v in vars(module).values() if base is not None and isinstance(v, base))


# The stores MLflow's tracking registry knows (mlflow.tracking._tracking_service.utils), a driver after '+'.
STORE_SCHEMES = frozenset(("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc",
                           "uc", "file", ""))


def uri_problems(uri: str) -> list[str]:
    """Why runs recorded at ``uri`` would never reach a store: an empty URI, an in-memory SQLite
    database (its runs end with the command), a scheme MLflow has no store for, a server without a
    host, a file store (MLflow 3 refuses one unless ``MLFLOW_ALLOW_FILE_STORE`` is true)."""
    from urllib.parse import urlsplit

    if not uri.strip():
        return ["is empty"]
    if uri.startswith(SQLITE_SCHEME):
        return [] if uri.removeprefix(SQLITE_SCHEME).strip() else ["names no database file"]
    try:
        parts = urlsplit(uri)
    except ValueError as e:
        return [f"is no URI: {e}"]
    scheme = parts.scheme.lower().split("+", 1)[0]
    if len(scheme) == 1:  # a Windows drive letter is a path
        scheme = ""
    if scheme == "sqlite":
        return ["is an in-memory SQLite database, whose runs end with the command: name its file, sqlite:///PATH"]
    if scheme not in STORE_SCHEMES and scheme not in _plugin_schemes():
        return [f"MLflow has no store for the scheme {scheme!r}: use sqlite:///PATH, http(s)://HOST:PORT, "
                "postgresql://, mysql://, mssql:// or databricks"]
    if scheme in ("http", "https") and not parts.hostname:
        return ["names no host"]
    if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        path = Path(parts.path if scheme == "file" else uri)
        if path.is_file():
            return [not_a_file_store(path)]
        return ["is a file store (a folder of runs), which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true: "
                "name a SQLite store, sqlite:///PATH"]
    return []


def not_a_file_store(path: Path) -> str:
    """A file given where a file store (a folder) goes: most likely a SQLite store named without its scheme."""
    return f"is a file, not a file store (a folder): a SQLite store is named sqlite:///{path.resolve()}"


def _plugin_schemes() -> set[str]:
    """The schemes of tracking stores MLflow plugins add (their entry points)."""
    from importlib.metadata import entry_points

    return {e.name.lower() for e in entry_points(group="mlflow.tracking_store")}


def tracking_for(uri: str | None = None, experiment: str | None = None,
                 state_dir: str | None = DEFAULT_STATE_DIR, work_dir: str | None = None) -> Tracking:
    """``TrackingSettings(uri, experiment, state_dir).resolve()``: an InputError for names that
    cannot be used (the flows start with this). Without a ``uri`` (nor ``MLFLOW_TRACKING_URI``)
    or a ``state_dir``, the default ones are in ``work_dir`` (none: the working directory)."""
    if uri is None and work_dir and not os.environ.get(URI_ENV):
        uri = sqlite_uri(in_work_dir(work_dir, DEFAULT_DB))
    return TrackingSettings(uri, experiment, state_dir_in(work_dir, state_dir)).resolve()


# SQLite opens no longer path (its unix VFS: 512 bytes with the NUL, less its journal's "-journal"; measured):
# a store in a deep working directory could never be opened, and its records waited for good.
MAX_SQLITE_PATH_BYTES = 504


def sqlite_path_problems(uri: str) -> list[Problem]:
    """Where ``uri`` is a SQLite store SQLite cannot open for the length of its path."""
    db = sqlite_path(uri)
    size = len(os.fsencode(str(db))) if db is not None else 0
    if size <= MAX_SQLITE_PATH_BYTES:
        return []
    return [Problem(f"tracking URI {show(uri)}", (
        f"its SQLite file's path is {size} bytes long; SQLite opens paths of up to {MAX_SQLITE_PATH_BYTES}: give "
        "--tracking-uri sqlite:////SHORTER/PATH/mlflow.db"))]


def resolve_uri(uri: str | None) -> str:
    """The URI runs go to: ``uri``, else ``MLFLOW_TRACKING_URI``, else ``DEFAULT_TRACKING_URI``;
    a SQLite database's path made absolute."""
    uri = uri or os.environ.get(URI_ENV) or DEFAULT_TRACKING_URI
    db = sqlite_path(uri)
    return sqlite_uri(db.resolve()) if db is not None else uri
