"""What the CLI lets third-party libraries print: only what a user needs, unless ``--verbose``.

Quiet by default: Prefect logs warnings and errors only (not its temporary server's start and
stop, nor every task's state); MLflow and its database migrations log nothing (shardflow reports
every MLflow failure itself, in one line, where MLflow would log a traceback per call), show no
progress bars and print no "View run" links; the embedded Prefect server sends no telemetry (it
cannot reach the internet from closed networks and would log an ERROR); Python warnings from
libraries are hidden, and a training's torchrun output stays in its log files. A failure the CLI
explains itself (an InputError, a TrainingFailed, MLflow unavailable, a stop the user asked for
with Ctrl-C) is not logged again by Prefect, three times over with tracebacks: the CLI prints its
one-line cause once.
``--verbose`` restores the libraries' own output (and ``SHARDFLOW_VERBOSE=1`` shows torchrun's).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from rec.errors import InputError
from rec.library_noise import quiet_unlisted_fbgemm
from tasks.tracking import MLFLOW_QUIET_ENV

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
KNOWN_FAILURES = ("InputError", "TrainingFailed")  # the CLI reports these itself
INTERRUPTED = "aborted by an interrupt signal"  # Prefect's words for a run stopped by Ctrl-C: the CLI says it
QUIET_ENV = {
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "MLFLOW_LOGGING_LEVEL": "CRITICAL",
    **MLFLOW_QUIET_ENV,  # also set wherever shardflow opens MLflow: flow runs of a worker too
    # Prefect's embedded server: no telemetry (an ERROR line without internet), no banner.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def set_up(verbose: bool) -> None:
    """Environment defaults for the libraries the CLI starts (a user's own settings win)."""
    from tasks.launch import VERBOSE_ENV

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
    logging.getLogger("alembic").setLevel(logging.CRITICAL)  # MLflow's database migrations
    # a local Ray's notice of its token authentication (shardflow's own Ray listens on loopback only)
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
    # export and predict: a checkpoint read in one process, TorchRec's modules built outside a job
    warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    quiet_unlisted_fbgemm()


class _KnownFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from tasks.tracking import TRACKING_WARNING

        if getattr(record, TRACKING_WARNING, False):
            return False
        raised = record.exc_info[1] if record.exc_info else None
        if isinstance(raised, InputError) or type(raised).__name__ in KNOWN_FAILURES:
            return False
        if isinstance(raised, KeyboardInterrupt):
            return False
        message = record.getMessage()
        return not any(name in message for name in (*KNOWN_FAILURES, INTERRUPTED))


@contextmanager
def input_errors_without_traceback() -> Iterator[None]:
    """While the block runs, Prefect does not log the failures the CLI reports itself (unless
    ``--verbose``)."""
    from tasks.launch import VERBOSE_ENV

    if os.environ.get(VERBOSE_ENV) == "1":
        yield
        return
    known = _KnownFailures()
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    for logger in loggers:
        logger.addFilter(known)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(known)
