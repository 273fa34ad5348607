"""One Prefect test server for every pytest worker of a run.

The first worker whose test needs it starts it; the others find it (``prefect-server.json`` in the
run's temporary directory, under a file lock). A start costs about 11 CPU-s, most of it migrating a
new database, and a server idles on about 0.9 CPU-s a minute: one server, not one per worker.

The server is the one ``shardflow run`` starts where no PREFECT_API_URL is set
(``flows.ephemeral_api``), held by a watcher (``python -m tests.flows.shared_prefect RUN_PID ROOT``)
in a session of its own, so that no worker's exit takes it along: the watcher stops it once the
run's pytest process (``RUN_PID``, the xdist controller) is gone, however the run ended, or on
SIGTERM, and it dies with the watcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from rec.file_lock import file_lock, process_alive

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
INFO = "prefect-server.json"  # {"url", "pid" (the watcher)}: written once the server answers
MIGRATED = "prefect-migrated.db"  # the server's database as it started: every migration, no runs
STARTUP_TIMEOUT_S = 180
POLL_S = 0.5


def run_root(basetemp: Path) -> Path:
    """The run's temporary directory, which every worker shares (a worker's own is ``popen-gwN`` in
    it); without xdist, the session's."""
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def run_pid() -> int:
    """The run's pytest process: the xdist controller, a worker's parent; without xdist, this one."""
    return os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()


def shared_server(root: Path) -> str:
    """The API URL of the run's test server, started here if no worker has started it."""
    info = root / INFO
    with file_lock(root / "prefect-server.lock"):
        if not info.exists():
            _start(root)
        return json.loads(info.read_text())["url"]


def _start(root: Path) -> None:
    log = root / "prefect-server.log"
    with log.open("ab") as out:
        watcher = subprocess.Popen([sys.executable, "-m", "tests.flows.shared_prefect", str(run_pid()), str(root)],
                                   cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S + 10
    while not (root / INFO).exists():
        if watcher.poll() is not None or time.monotonic() > deadline:
            watcher.kill()
            raise RuntimeError(f"the Prefect test server did not start: {log.read_text()[-3000:]}")
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    """Start the server (as ``shardflow run`` starts Prefect's ephemeral API: ``flows.ephemeral_api``),
    say where it answers, and hold it while the run's pytest process lives."""
    pid, root = int(argv[0]), Path(argv[1])
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    database = root / "prefect-server.db"
    os.environ.pop("PREFECT_API_URL", None)  # a server of the user's: never the tests'
    os.environ.update(SERVER_ENV, PREFECT_HOME=str(root / "prefect-home"),
                      PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{database}",
                      PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=str(STARTUP_TIMEOUT_S))
    from prefect.settings import PREFECT_API_URL

    from flows.ephemeral_api import ephemeral_api

    with ephemeral_api():
        with contextlib.closing(sqlite3.connect(database)) as db, \
                contextlib.closing(sqlite3.connect(root / MIGRATED)) as copy:
            db.backup(copy)  # a consistent copy of a database the server may be writing
        written = root / f"{INFO}.tmp"
        written.write_text(json.dumps({"url": PREFECT_API_URL.value(), "pid": os.getpid()}))
        written.replace(root / INFO)
        while not stopping and process_alive(pid):
            time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
