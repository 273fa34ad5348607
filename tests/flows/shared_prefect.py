"""One Prefect test server for every pytest worker of a run.

The first worker whose test needs it starts it; the others find it (``prefect-server.json`` in the
run's temporary directory, under a file lock). A start costs about 11 CPU-s, most of it migrating a
new database, and a server idles on about 0.9 CPU-s a minute: one server, not one per worker.

The server is held by a watcher (``python -m tests.flows.shared_prefect RUN_PID ROOT``), in a
session of its own so that no worker's exit takes it along: the watcher stops it once the run's
pytest process (``RUN_PID``, the xdist controller) is gone, however the run ended, or on SIGTERM.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
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
# As Prefect's own test harness runs its server (``SubprocessASGIServer``): no UI, an ephemeral app.
HARNESS_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
INFO = "prefect-server.json"  # {"url", "pid"}: written once the server answers
MIGRATED = "prefect-migrated.db"  # the server's database as it started: every migration, no runs
STARTUP_TIMEOUT_S = 180.0
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _serve(root: Path, pid: int) -> tuple[subprocess.Popen[bytes], str]:
    """The server, answering at the URL returned (on a new port where the first was taken meanwhile);
    SystemExit, the server stopped, where none answers or the run ``pid`` ends first."""
    database = root / "prefect-server.db"
    env = {**os.environ, **SERVER_ENV, **HARNESS_ENV, "PREFECT_HOME": str(root / "prefect-home"),
           "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{database}"}
    env.pop("PREFECT_API_URL", None)
    found = importlib.util.find_spec("prefect")  # not imported: seconds of CPU
    assert found is not None and found.origin is not None, "prefect is not installed"
    prefect_dir = Path(found.origin).parent
    for _ in range(3):
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir.parent), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "error", "--lifespan", "on"], env=env, stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while server.poll() is None and time.monotonic() < deadline and process_alive(pid) and not _answers(url):
            time.sleep(0.1)
        if not process_alive(pid):
            _stop(server)
            raise SystemExit("the run ended before its Prefect test server answered")
        if server.poll() is None and _answers(url):
            with contextlib.closing(sqlite3.connect(database)) as db, \
                    contextlib.closing(sqlite3.connect(root / MIGRATED)) as copy:
                db.backup(copy)  # a consistent copy of a database the server may be writing
            return server, url
        _stop(server)
    raise SystemExit("the Prefect test server did not answer")


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main(argv: list[str]) -> int:
    """Start the server, say where it answers, and hold it while the run's pytest process lives."""
    pid, root = int(argv[0]), Path(argv[1])
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    server, url = _serve(root, pid)
    try:
        written = root / f"{INFO}.tmp"
        written.write_text(json.dumps({"url": url, "pid": server.pid}))
        written.replace(root / INFO)
        while not stopping and server.poll() is None and process_alive(pid):
            time.sleep(POLL_S)
    finally:
        _stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
