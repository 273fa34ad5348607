"""``shardflow serve``: the deployments of deploy/prefect.yaml, and the replan schedule firing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from flows.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHARDFLOW = Path(sys.executable).parent / "shardflow"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect
EXPECTED = {"plan": "shardflow-plan", "pipeline": "shardflow-pipeline",
            "replan-on-schema-change": "shardflow-replan"}
REPLAN_EVERY_S = 5
# Generous: a Prefect server starting and flow-run subprocesses importing torch on a loaded 2-core
# machine. The test ends as soon as two scheduled replans have completed (about a minute).
DEADLINE_S = 300


def test_serve_lists_the_deployments_of_prefect_yaml(capsys):
    assert main(["serve", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [f"{flow}/{name}" for name, flow in EXPECTED.items()]
    assert "cron '*/15 * * * *'" in lines[2] and "on demand" in lines[0]


def test_serve_overrides_parameters_and_the_replan_schedule(capsys):
    assert main(["serve", "--list", "--replan-every", "30", "--set", "out_dir=/tmp/o",
                 "--set", "train_iterations=5"]) == 0
    plan, pipeline, replan = capsys.readouterr().out.splitlines()
    assert replan.endswith("every 30 s") and "cron" not in replan
    assert "'out_dir': '/tmp/o'" in plan and "'train_iterations': 5" in pipeline
    assert "train_iterations" not in plan  # only flows that have the parameter get it


def test_serve_refuses_unknown_parameters_and_bad_intervals(capsys):
    assert main(["serve", "--list", "--set", "no_such=1", "--replan-every", "0"]) == 2
    err = capsys.readouterr().err
    assert "--set no_such" in err and "--replan-every: needs a positive number" in err
    assert main(["serve", "--list", "--set", "out_dir"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_served_replan_schedule_fires_and_each_run_is_recorded_in_mlflow(tmp_path):
    """A real Prefect server (the test harness runs no scheduler), started by ``shardflow serve``
    itself; the replan deployment on a 5 s interval instead of its cron."""
    import httpx
    from mlflow import MlflowClient
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_UI_ENABLED="0",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_RUNNER_POLL_FREQUENCY="1")
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        # --limit 1: one replan at a time, so the second one compares with the first.
        serve = subprocess.Popen(
            [str(SHARDFLOW), "serve", "--port", str(port), "--limit", "1",
             "--replan-every", str(REPLAN_EVERY_S), "--set", f"tracking_uri={uri}",
             "--set", f"out_dir={tmp_path / 'out'}", "--set", f"state_dir={tmp_path / 'state'}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deployments, completed = {}, []
        deadline = time.monotonic() + DEADLINE_S
        with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as client:
            while time.monotonic() < deadline and serve.poll() is None and len(completed) < 2:
                time.sleep(1)
                try:
                    deployments = {d.name: d for d in client.read_deployments()}
                    if "replan-on-schema-change" not in deployments:
                        continue
                    runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
                        id=DeploymentFilterId(any_=[deployments["replan-on-schema-change"].id])))
                except httpx.HTTPError:  # the server is still starting
                    continue
                completed = [r for r in runs if r.state is not None and r.state.is_completed()]
    finally:
        serve.send_signal(signal.SIGINT)  # serve stops its runner, then the server it started
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        try:
            os.killpg(serve.pid, signal.SIGKILL)  # anything of the group still alive
        except ProcessLookupError:
            pass
    assert len(completed) >= 2, log.read_text()[-5000:]

    assert set(deployments) == set(EXPECTED)
    replan = deployments["replan-on-schema-change"]
    assert [s.schedule.interval for s in replan.schedules] == [timedelta(seconds=REPLAN_EVERY_S)]
    assert replan.parameters["spec_path"] == "examples/specs/cpu_demo.yaml"  # from prefect.yaml
    assert replan.parameters["tracking_uri"] == uri  # from --set
    assert deployments["pipeline"].parameters["train_iterations"] == 20
    assert all(r.auto_scheduled for r in completed)  # fired by the schedule, not by hand

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow").experiment_id
    replans = client.search_runs([experiment], "tags.`shardflow.step` = 'replan'",
                                 order_by=["attributes.start_time ASC"])
    assert len(replans) >= len(completed)
    first, second = replans[:2]
    assert [first.data.tags["shardflow.replan"], second.data.tags["shardflow.replan"]] == \
        ["replanned", "unchanged"]
    assert first.info.status == second.info.status == "FINISHED"
    assert first.data.tags["shardflow.plan_id"] == second.data.tags["shardflow.plan_id"]
    assert (tmp_path / "out" / "plan" / "plan.json").exists()
