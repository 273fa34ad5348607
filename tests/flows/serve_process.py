"""A real ``shardflow serve`` process for the serve tests: it starts its own Prefect server (the test
harness runs no scheduler) and serves the replan deployment on a short interval."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.paths import SHARDFLOW

REPLAN_EVERY_S = 5
# Generous: a Prefect server starting and flow-run subprocesses importing torch on a loaded 2-core
# machine. The tests end as soon as what they wait for has happened.
DEADLINE_S = 300
STOP_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Serving:
    process: subprocess.Popen[bytes]
    url: str  # the Prefect API of the server serve started
    out: Path  # serve's stdout
    err: Path  # serve's stderr
    seen: set[psutil.Process] = field(default_factory=set)  # every process of it a tree() saw

    def tree(self) -> list[psutil.Process]:
        """serve and every process under it, now."""
        try:
            me = psutil.Process(self.process.pid)
            tree = [me, *me.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        self.seen.update(tree)
        return tree

    def server(self) -> psutil.Process:
        """The ``prefect server start`` process serve started."""
        return next(p for p in self.tree()[1:] if p.cmdline()[2:5] == ["prefect", "server", "start"])

    @staticmethod
    def replans(client: Any) -> list[Any]:
        """The flow runs of the replan deployment so far (``client``: a sync Prefect client of the
        server); [] while the server or the deployment is not up yet."""
        import httpx
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        try:
            deployment = {d.name: d for d in client.read_deployments()}.get("replan-on-schema-change")
            if deployment is None:
                return []
            return client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
        except httpx.HTTPError:  # the server is still starting
            return []

    def wait_for_replans(self, count: int, state: str = "COMPLETED") -> list[Any]:
        """The replans in ``state`` (a Prefect StateType name), once there are ``count``; asked
        every second, by one client (a new client and settings each time cost ~0.1 CPU-s)."""
        from prefect import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        deadline = time.monotonic() + DEADLINE_S
        found: list[Any] = []
        with temporary_settings(updates={PREFECT_API_URL: self.url}), get_client(sync_client=True) as client:
            while time.monotonic() < deadline and self.process.poll() is None and len(found) < count:
                time.sleep(1)
                found = [r for r in self.replans(client) if r.state is not None and r.state.type.name == state]
        assert len(found) >= count, self.output()
        return found

    def output(self) -> str:
        return (self.out.read_text() + self.err.read_text())[-5000:]


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@contextmanager
def served(tmp_path: Path, cwd: Path, *args: str, database: Path) -> Iterator[Serving]:
    """``shardflow serve`` in ``cwd`` (replans every REPLAN_EVERY_S, one flow run at a time, so the
    second replan compares with the first), its Prefect home in ``tmp_path``, holding a copy of
    ``database`` (the ``prefect_database`` fixture: the server serve starts migrates none). Whatever
    of it is still alive after the block is killed."""
    (tmp_path / "prefect").mkdir()
    shutil.copyfile(database, tmp_path / "prefect" / "prefect.db")  # where Prefect's server keeps it by default
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_UI_ENABLED="0",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_RUNNER_POLL_FREQUENCY="1")
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [str(SHARDFLOW), "serve", "--port", str(port), "--limit", "1",
             "--replan-every", str(REPLAN_EVERY_S), *args],
            cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    serving = Serving(process, f"http://127.0.0.1:{port}/api", out, err)
    try:
        yield serving
    finally:
        serving.tree()
        if process.poll() is None:
            process.kill()
        process.wait()
        for p in alive(list(serving.seen)):
            p.kill()


def stop(serving: Serving, how: signal.Signals, group: bool = False) -> tuple[int, list[psutil.Process]]:
    """Send ``how`` to serve (to its process group, as Ctrl-C at a terminal does, with ``group``);
    its exit code and the processes of it still alive a moment after it exited."""
    tree = serving.tree()
    if group:
        os.killpg(serving.process.pid, how)
    else:
        serving.process.send_signal(how)
    code = serving.process.wait(timeout=STOP_TIMEOUT_S)
    time.sleep(1)  # the kernel's parent-death signals, and the children's own exits
    return code, alive(tree)
