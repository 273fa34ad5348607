"""MLflow, as shardflow uses it; plain functions over an ``MlflowClient``, no Prefect.

By concern: ``settings`` (where runs go: the URI, the experiment, the outbox), ``store`` (whether a
store can be used, opening it), ``delivery`` (one record into MLflow) and ``queries`` (finding
shardflow's runs). The names other modules use are importable from here too.
"""

from tasks.tracking.delivery import deliver
from tasks.tracking.queries import download_plan, find_runs, last_planning, run_of_record
from tasks.tracking.settings import (
    ARTIFACTS_DIR,
    DEFAULT_DB,
    DEFAULT_EXPERIMENT,
    DEFAULT_TRACKING_URI,
    SQLITE_SCHEME,
    Tracking,
    TrackingSettings,
    resolve_uri,
    sqlite_path,
    sqlite_uri,
    tracking_for,
)
from tasks.tracking.store import (
    MLFLOW_QUIET_ENV,
    STORE_WAIT_S,
    TRACKING_WARNING,
    RunNotFound,
    TrackingUnavailable,
    check_store,
    connect,
    one_line,
    open_read_only,
    quiet_mlflow,
    store_problem,
    tracking_failure,
)

__all__ = [
    "ARTIFACTS_DIR",
    "DEFAULT_DB",
    "DEFAULT_EXPERIMENT",
    "DEFAULT_TRACKING_URI",
    "MLFLOW_QUIET_ENV",
    "SQLITE_SCHEME",
    "STORE_WAIT_S",
    "TRACKING_WARNING",
    "RunNotFound",
    "Tracking",
    "TrackingSettings",
    "TrackingUnavailable",
    "check_store",
    "connect",
    "deliver",
    "download_plan",
    "find_runs",
    "last_planning",
    "one_line",
    "open_read_only",
    "quiet_mlflow",
    "resolve_uri",
    "run_of_record",
    "sqlite_path",
    "sqlite_uri",
    "store_problem",
    "tracking_failure",
    "tracking_for",
]
