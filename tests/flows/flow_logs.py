"""Flows as a Prefect worker runs them, and a flow run's log as the Prefect API keeps it (what its
UI shows of the run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT

FINISHED = "Finished in state"  # Prefect's own last line of a flow run


def as_worker(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -c code args`` as a worker runs flows: a process of its own on the test server,
    without the CLI's quiet settings (a worker logs at INFO)."""
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SHARDFLOW_", "PREFECT_LOGGING"))}
    env.update(PREFECT_API_URL=str(PREFECT_API_URL.value()), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)


def flow_log(flow_run_id: str) -> list[str]:
    """The messages of the flow run's log, oldest first, without Prefect's own closing line."""
    from uuid import UUID

    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(flow_run_id)])),
                                sort=LogSort.TIMESTAMP_ASC)
    return [log.message for log in logs if not log.message.startswith(FINISHED)]
