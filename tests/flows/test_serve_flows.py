"""``shardflow serve``: the deployments of deploy/prefect.yaml, and stopping serve."""

from __future__ import annotations

import signal

import pytest

from flows.cli import main
from tests.flows.serve_process import served, stop

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect
EXPECTED = {"plan": "shardflow-plan", "pipeline": "shardflow-pipeline",
            "replan-on-schema-change": "shardflow-replan"}


def test_serve_lists_the_deployments_of_prefect_yaml(capsys):
    assert main(["serve", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [f"{flow}/{name}" for name, flow in EXPECTED.items()]
    assert "cron '*/15 * * * *'" in lines[2] and "on demand" in lines[0]


def test_serve_overrides_parameters_and_the_replan_schedule(capsys):
    assert main(["serve", "--list", "--replan-every", "30", "--set", "out_dir=/tmp/o",
                 "--set", "training.job.iterations=5", "--set", "searching.max_regress=0.1"]) == 0
    plan, pipeline, replan = capsys.readouterr().out.splitlines()
    assert replan.endswith("every 30 s") and "cron" not in replan
    assert "'out_dir': '/tmp/o'" in plan and "'training': {'job': {'iterations': 5}}" in pipeline
    assert "'searching': {'max_regress': 0.1}" in plan and "'searching': {'max_regress': 0.1}" in pipeline
    assert "training" not in plan  # only flows that have the parameter get it


def test_serve_refuses_unknown_parameters_and_bad_intervals(capsys):
    assert main(["serve", "--list", "--set", "no_such=1", "--replan-every", "0"]) == 2
    err = capsys.readouterr().err
    assert "--set no_such" in err and "--replan-every: needs a positive number" in err
    assert main(["serve", "--list", "--set", "out_dir"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_stops_serve_its_server_and_the_flow_run_in_progress(tmp_path, mlflow_uri, prefect_database):
    """A real ``shardflow serve`` with the Prefect server it starts; SIGTERM (as a service manager
    stops it) while a scheduled replan runs: serve exits 0 and none of its processes is left."""
    with served(tmp_path, tmp_path, "--set", f"tracking.tracking_uri={mlflow_uri}",
                "--set", f"tracking.state_dir={tmp_path / 'state'}", "--set", f"out_dir={tmp_path / 'out'}",
                database=prefect_database) as serving:
        serving.wait_for_replans(1, state="RUNNING")
        assert len(serving.tree()) >= 3  # serve, its server, the flow run
        code, left = stop(serving, signal.SIGTERM)
    assert code == 0, serving.output()
    assert left == [], [p.cmdline() for p in left]
    assert "Traceback" not in serving.output(), serving.output()
