"""One Prefect test harness (a temporary Prefect server) for every flow test: it is slow to start."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

# The server's telemetry write races its own start-up on SQLite ("database is locked"). The services
# that schedule, expire, cancel or reconcile runs, or fire automations, act on nothing these tests
# make (deployments and schedules are served by servers of their own): off, the test server starts
# with 6 s less CPU and idles on 0.9 CPU-s a minute instead of 1.25. The event persister writes every
# event of every flow and task run to the database (the UI's event feed), which no test reads (task
# runs are recorded from the events by the task run recorder, which stays on): off, a flow run costs
# the server ~30% less CPU.
SERVER_ENV = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"} | {
    f"PREFECT_SERVER_SERVICES_{service}_ENABLED": "false"
    for service in ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "REPOSSESSOR",
                    "CANCELLATION_CLEANUP", "CLEANUP_RECONCILER", "TRIGGERS", "EVENT_PERSISTER")}
MIGRATED = "prefect-migrated.db"  # prefect_database's file, in the session's temporary directory


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """The test server's API URL. A ``shardflow`` subprocess given it as PREFECT_API_URL runs its
    flows there instead of starting a temporary server of its own (seconds of CPU each)."""
    from flows.logs import set_up

    # Prefect sets up its logging once per process, the first time it is used: with the CLI's quiet
    # settings, whichever test comes first (a flow called directly, or the CLI).
    set_up(verbose=False)
    from prefect.testing.utilities import prefect_test_harness

    previous = {name: os.environ.get(name) for name in SERVER_ENV}
    os.environ.update(SERVER_ENV)
    try:
        with prefect_test_harness(server_startup_timeout=180):
            from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_DATABASE_CONNECTION_URL

            # The servers tests start themselves (``shardflow serve``) run every service.
            _restore({name: value for name, value in previous.items() if "_SERVICES_" in name})
            database = PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1]
            _copy_database(Path(database), tmp_path_factory.getbasetemp() / MIGRATED)
            yield PREFECT_API_URL.value()
    finally:
        _restore(previous)


@pytest.fixture(scope="session")
def prefect_database(prefect_api, tmp_path_factory) -> Path:
    """A Prefect database with its tables made (every migration applied) and no runs: the test
    server's as it had just started. A Prefect server of a test's own (``shardflow serve``) given a
    copy in its PREFECT_HOME starts without migrating a new one (about half of its start's CPU)."""
    return tmp_path_factory.getbasetemp() / MIGRATED


def _copy_database(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite database that a server may be writing (SQLite's backup)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(source)) as db, contextlib.closing(sqlite3.connect(target)) as copy:
        db.backup(copy)


def _restore(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
