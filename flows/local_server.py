"""A Prefect server for ``shardflow serve`` when none is configured: schedules need its scheduler,
which Prefect's ephemeral API does not run."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rec.errors import InputError, Problem

STARTUP_TIMEOUT_S = 120


@contextmanager
def prefect_api(port: int) -> Iterator[str]:
    """The configured ``PREFECT_API_URL``, or a local server started on ``port`` for the block."""
    import httpx
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    configured = get_current_settings().api.url
    if configured:
        yield configured
        return
    url = f"http://127.0.0.1:{port}/api"
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start",
                               "--host", "127.0.0.1", "--port", str(port)])
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if server.poll() is not None:
                raise InputError("Cannot start a local Prefect server:", [
                    Problem(f"127.0.0.1:{port}", f"prefect server start exited {server.returncode}; "
                                                 "is the port taken? try --port or set PREFECT_API_URL")])
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise InputError("Cannot start a local Prefect server:",
                                 [Problem(url, f"no answer after {STARTUP_TIMEOUT_S} s")])
            time.sleep(0.5)
        print(f"Prefect server at {url.removesuffix('/api')} (UI); stopped when serving stops")
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
