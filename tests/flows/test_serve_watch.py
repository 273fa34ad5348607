"""``shardflow serve`` from anywhere: deployment paths resolve against the deployment file, and a
lost Prefect server stops serving with one line, leaving no process behind."""

from __future__ import annotations

import shutil
import time
from datetime import timedelta

import pytest

from flows.cli import main
from tests.flows.flow_logs import flow_log
from tests.flows.serve_process import REPLAN_EVERY_S, STOP_TIMEOUT_S, alive, free_port, served
from tests.paths import CPU_2PROC, DEMO, ROOT
from tests.stores import store_from

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect


def logs_once_sent(runs: list, timeout_s: float = 30) -> list[list[str]]:
    """The runs' logs, once each ends with its outcome (Prefect sends a run's log lines in batches,
    also after its state)."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = [flow_log(str(r.id)) for r in runs]
        if all(log and log[-1].startswith(("replanned:", "unchanged:")) for log in logs) \
                or time.monotonic() > deadline:
            return logs
        time.sleep(1)


def listed(capsys) -> dict[str, str]:
    """``serve --list`` lines by deployment name."""
    return {line.split()[0].split("/")[1]: line for line in capsys.readouterr().out.splitlines()}


def test_deployment_paths_are_relative_to_the_deployment_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "deploy").mkdir()
    (tmp_path / "inputs").mkdir()
    shutil.copy(DEMO, tmp_path / "inputs" / "spec.yaml")
    shutil.copy(CPU_2PROC, tmp_path / "inputs" / "topology.yaml")
    prefect_file = tmp_path / "deploy" / "prefect.yaml"
    prefect_file.write_text(f"""
deployments:
  - name: replan
    entrypoint: {ROOT}/flows/replan.py:replan_flow
    parameters: {{spec_path: ../inputs/spec.yaml, topology_path: ../inputs/topology.yaml,
                 tracking: {{state_dir: ../state, tracking_uri: "sqlite:///../mlflow.db"}}}}
  - name: plan
    entrypoint: flows.plan.plan_flow
    parameters: {{spec_path: {tmp_path}/inputs/spec.yaml, topology_path: ../inputs/topology.yaml}}
""")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    assert main(["serve", "--list", "--prefect-file", "../deploy/prefect.yaml", "--set", "out_dir=out"]) == 0
    lines = listed(capsys)
    assert f"'spec_path': '{tmp_path}/inputs/spec.yaml'" in lines["replan"]
    assert f"'topology_path': '{tmp_path}/inputs/topology.yaml'" in lines["replan"]
    assert f"'tracking': {{'state_dir': '{tmp_path}/state', 'tracking_uri': 'sqlite:///{tmp_path}/mlflow.db'}}" \
        in lines["replan"]
    assert f"'out_dir': '{elsewhere}/out'" in lines["replan"]  # --set: relative to the working directory
    assert f"'spec_path': '{tmp_path}/inputs/spec.yaml'" in lines["plan"]  # absolute stays


def test_the_repository_deployments_list_the_same_from_anywhere(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--list"]) == 0
    for line in listed(capsys).values():
        assert f"'spec_path': '{DEMO}'" in line and f"'topology_path': '{CPU_2PROC}'" in line
        assert f"'work_dir': '{ROOT}'" in line  # runs write where `shardflow run` in the repository does


def test_a_deployment_run_in_deploy_writes_in_its_work_dir_where_compare_sees_it(prefect_api, tmp_path,
                                                                                 monkeypatch, capsys):
    """A worker of ``prefect deploy`` runs the flow in deploy/ with deploy/prefect.yaml's
    ``work_dir: ..``: the plan, shardflow's state and MLflow's store land one level up, as
    ``shardflow run`` there would write them, and ``shardflow compare`` there lists the run."""
    from flows.plan import plan_flow

    deploy = tmp_path / "deploy"
    deploy.mkdir()
    monkeypatch.chdir(deploy)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    outcome = plan_flow(str(DEMO), str(CPU_2PROC), work_dir="..")
    assert list(deploy.iterdir()) == []
    assert (tmp_path / "out" / outcome.plan_id / "plan" / "plan.json").is_file()
    assert (tmp_path / "mlflow.db").is_file() and (tmp_path / ".shardflow" / "plan-cache").is_dir()
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["compare"]) == 0
    assert outcome.plan_id in capsys.readouterr().out


def test_missing_inputs_and_entry_points_are_named_before_serving(tmp_path, capsys):
    prefect_file = tmp_path / "prefect.yaml"
    prefect_file.write_text(f"""
deployments:
  - name: replan
    entrypoint: {ROOT}/flows/replan.py:replan_flow
    parameters: {{spec_path: no-spec.yaml, topology_path: {CPU_2PROC}}}
  - name: gone
    entrypoint: flows/nothing.py:nothing_flow
  - name: typo
    entrypoint: flows.plan.plan_flw
  - name: bare
    entrypoint: plan_flow
""")
    assert main(["serve", "--list", "--prefect-file", str(prefect_file)]) == 2
    err = capsys.readouterr().err
    assert f"spec_path: no such file: {tmp_path}/no-spec.yaml" in err
    assert f"flows/nothing.py:nothing_flow: no such file: {tmp_path}/flows/nothing.py" in err
    assert "flows.plan has no flow 'plan_flw'" in err
    assert "plan_flow: expected FILE.py:FLOW or MODULE.FLOW" in err
    assert "Traceback" not in err


def test_every_path_parameter_and_path_setting_of_the_flows_is_resolved():
    """A path is named by its parameter (``*_path``, ``*_dir``) or by its knob (``knob(path=True)``),
    never by a list: every one of every flow resolves."""
    import dataclasses

    from flows.deployments import absolute_paths, flow_parameters
    from flows.pipeline import pipeline_flow
    from flows.plan import plan_flow
    from flows.replan import replan_flow
    from flows.train import train_flow
    from rec.settings import is_path
    from rec.train.config import TrainConfig

    base = ROOT / "deploy"
    for flow in (plan_flow, pipeline_flow, replan_flow, train_flow):
        named = {name: "x" for name in flow_parameters(flow) if name.endswith(("_path", "_dir"))}
        assert absolute_paths(flow, named, base) == {name: str(base / "x") for name in named}
    job = {f.name: f.name for f in dataclasses.fields(TrainConfig) if is_path(f)}
    assert {"data", "checkpoint_dir", "resume_from"} <= set(job)
    absolute = {name: str(base / name) for name in job}
    tracking = {"state_dir": "s", "tracking_uri": "sqlite:///m.db", "experiment": "e"}
    for flow in (pipeline_flow, train_flow):
        given = {"training": {"job": {**job, "model": "m"}, "nnodes": 2}, "tracking": tracking}
        assert absolute_paths(flow, given, base) == {
            "training": {"job": {**absolute, "model": "m"}, "nnodes": 2},
            "tracking": {"state_dir": str(base / "s"), "tracking_uri": f"sqlite:///{base / 'm.db'}", "experiment": "e"}}


def test_a_configured_server_that_does_not_answer_is_named_before_serving(capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    with temporary_settings(updates={PREFECT_API_URL: url}):
        assert main(["serve", "--replan-every", "5"]) == 2
    title, problem = capsys.readouterr().err.splitlines()
    assert title == "shardflow: Cannot serve:" and problem.startswith(f"  - PREFECT_API_URL={url} (")
    assert problem.endswith("): no Prefect server answers")  # where it was set: here, Prefect's own settings


def test_the_watch_gives_up_on_a_server_that_stopped_answering():
    """Two of the runner's polls without an answer (Prefect's runner stops polling after three)."""
    import threading

    from prefect.settings import PREFECT_RUNNER_POLL_FREQUENCY, temporary_settings

    from flows.local_server import PrefectApi, lost

    url = f"http://127.0.0.1:{free_port()}/api"
    with temporary_settings(updates={PREFECT_RUNNER_POLL_FREQUENCY: 1}):
        assert lost(PrefectApi(url, None), threading.Event()) == \
            "the Prefect server at " + url.removesuffix("/api") + " has not answered for 2 s"


@pytest.mark.slow
def test_served_from_anywhere_the_replan_schedule_fires_then_a_killed_server_stops_serving_in_one_line(
        tmp_path, prefect_database, mlflow_template):
    """``shardflow serve`` from a directory outside the repository, with the repository's
    deploy/prefect.yaml and the replan deployment on a 5 s interval: the scheduled replans find
    their spec, the first plans (recorded in MLflow) and the next find it unchanged (the test
    harness runs no scheduler: serve starts a real Prefect server). Then that server is SIGKILLed:
    serve exits 1 within STOP_TIMEOUT_S with one line on stderr, no traceback anywhere, and no
    process of it left."""
    from mlflow import MlflowClient
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    cwd = tmp_path / "elsewhere"
    store_from(mlflow_template, cwd)  # the replans' MLflow store, its tables made
    # --set paths relative to serve's working directory
    with served(tmp_path, cwd, "--set", "tracking.tracking_uri=sqlite:///mlflow.db", "--set", "out_dir=out",
                "--set", "tracking.state_dir=state", database=prefect_database) as serving:
        completed = serving.wait_for_replans(2)
        with temporary_settings(updates={PREFECT_API_URL: serving.url}), get_client(sync_client=True) as client:
            deployments = {d.name: d for d in client.read_deployments()}
            run_logs = logs_once_sent(sorted(completed, key=lambda r: r.start_time)[:2])
        tree = serving.tree()
        before = serving.err.read_text()
        serving.server().kill()
        killed = time.monotonic()
        code = serving.process.wait(timeout=STOP_TIMEOUT_S)
        print(f"serve exited {time.monotonic() - killed:.2f} s after its server was killed")
        time.sleep(1)  # the children's own exits
        left = alive(tree)
    err = serving.err.read_text()

    assert code == 1, serving.output()
    server_log = tmp_path / "prefect" / "shardflow-server.log"  # in PREFECT_HOME
    assert err.removeprefix(before).splitlines() == [
        f"shardflow: the Prefect server it started at {serving.url.removesuffix('/api')} was killed by "
        f"SIGKILL (its output: {server_log}); serving stopped"]
    assert serving.url.removesuffix("/api") in server_log.read_text()  # its banner, not on the terminal
    assert "Traceback" not in serving.out.read_text() + err, serving.output()
    assert left == [], [p.cmdline() for p in left]

    assert set(deployments) == {"plan", "pipeline", "replan-on-schema-change"}
    replan = deployments["replan-on-schema-change"]
    assert [s.schedule.interval for s in replan.schedules] == [timedelta(seconds=REPLAN_EVERY_S)]
    assert replan.parameters["spec_path"] == str(DEMO)  # prefect.yaml's ../examples/...
    assert replan.parameters["tracking"] == {"tracking_uri": f"sqlite:///{cwd / 'mlflow.db'}",
                                             "state_dir": str(cwd / "state")}
    # The pipeline trains as `shardflow run` does: prefect.yaml restates none of the flows' defaults.
    assert "training" not in deployments["pipeline"].parameters
    assert all(r.auto_scheduled for r in completed)  # fired by the schedule, not by hand
    # Without -v, the served runs' log holds shardflow's lines (the CLI's), not Prefect's own INFO lines:
    # an unchanged replan's check was once recorded nowhere.
    assert [log[-1].split(" spec hash ")[0] if log else None for log in run_logs] == ["replanned:", "unchanged:"], \
        run_logs
    assert not [m for log in run_logs for m in log if m.startswith(("Beginning flow run", "Created task run"))]
    assert run_logs[1][-1] in serving.out.read_text() + before  # and in serve's own output

    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("shardflow").experiment_id
    replans = client.search_runs([experiment], "tags.`shardflow.step` = 'replan'",
                                 order_by=["attributes.start_time ASC"])
    plans = client.search_runs([experiment], "tags.`shardflow.step` = 'plan'")
    # --limit 1: each replan compared with the one before; only the first planned (an unchanged
    # replan records at most a small run tagged unchanged)
    assert [r.data.tags["shardflow.replan"] for r in replans] == ["replanned"] + ["unchanged"] * (len(replans) - 1)
    assert len(plans) == 1 and plans[0].info.status == replans[0].info.status == "FINISHED"
    assert plans[0].data.tags["shardflow.spec_path"] == str(DEMO)
    assert (cwd / "out" / "plan" / "plan.json").is_file()
