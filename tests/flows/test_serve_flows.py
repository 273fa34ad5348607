"""``shardflow serve``: the deployments of deploy/prefect.yaml, including the cron replan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHARDFLOW = Path(sys.executable).parent / "shardflow"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect
EXPECTED = {"plan": "shardflow-plan", "pipeline": "shardflow-pipeline",
            "replan-on-schema-change": "shardflow-replan"}


def test_serve_lists_the_deployments_of_prefect_yaml(capsys):
    assert main(["serve", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [f"{flow}/{name}" for name, flow in EXPECTED.items()]
    assert "cron '*/15 * * * *'" in lines[2] and "on demand" in lines[0]


def test_served_deployments_are_registered_and_run(prefect_api, tmp_path):
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    server = subprocess.Popen([str(SHARDFLOW), "serve"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(),
                                   "PREFECT_RUNNER_POLL_FREQUENCY": "1"})
    try:
        deadline = time.monotonic() + 120
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline and server.poll() is None:
                deployments = {d.name: d for d in client.read_deployments()}
                if set(EXPECTED) <= set(deployments):
                    break
                time.sleep(1)
        assert set(EXPECTED) <= set(deployments), server.stdout.read() if server.poll() is not None else ""
        replan = deployments["replan-on-schema-change"]
        assert [s.schedule.cron for s in replan.schedules] == ["*/15 * * * *"]
        assert replan.parameters["spec_path"] == "examples/specs/cpu_demo.yaml"
        assert deployments["pipeline"].parameters["train_iterations"] == 20

        run = run_deployment("shardflow-plan/plan", timeout=180, parameters={
            "out_dir": str(tmp_path / "out"), "state_dir": str(tmp_path / "state"),
            "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
        assert run.state.is_completed(), run.state
        assert (tmp_path / "out" / "plan" / "plan.json").exists()
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
