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
                 "--set", "training.job.iterations=50", "--set", "searching.max_regress=0.1"]) == 0
    plan, pipeline, replan = capsys.readouterr().out.splitlines()
    assert replan.endswith("every 30 s") and "cron" not in replan
    assert "'out_dir': '/tmp/o'" in plan and "'training': {'job': {'iterations': 50}}" in pipeline
    assert "'searching': {'max_regress': 0.1}" in plan and "'searching': {'max_regress': 0.1}" in pipeline
    assert "training" not in plan  # only flows that have the parameter get it


def test_serve_refuses_unknown_parameters_and_bad_intervals(capsys):
    assert main(["serve", "--list", "--set", "no_such=1", "--replan-every", "0"]) == 2
    err = capsys.readouterr().err
    assert "--set no_such" in err and "--replan-every: needs a number of seconds above 0" in err
    assert main(["serve", "--list", "--set", "out_dir"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_serve_names_every_value_its_runs_would_refuse_before_serving(tmp_path, capsys):
    """Each was once a traceback (exit 1), or served and failed every run."""
    assert main(["serve", "--list", "--replan-every", "inf", "--limit", "0", "--port", "99999"]) == 2
    err = capsys.readouterr().err
    assert "--port: must be from 1 to 65535" in err and "--limit: must be at least 1" in err
    assert main(["serve", "--list", "--replan-every", "inf"]) == 2
    assert "--replan-every: needs a number of seconds above 0, at most 31,622,400, not inf" in capsys.readouterr().err
    assert main(["serve", "--list", "--set", "training.job.iterations=-3", "--set", "searching.backend=gpu",
                 "--set", "tracking.track=false"]) == 2
    err = capsys.readouterr().err
    assert "pipeline: --iterations: must be at least 1, got -3" in err
    assert "searching.backend: 'gpu' is not a valid Backend" in err and "tracking.track: is false" in err
    deployments = tmp_path / "prefect.yaml"
    deployments.write_text("""deployments:
  - name: r
    entrypoint: flows/replan.py:replan_flow
    schedules: [{cron: "*/99 * * *"}, {interval: -5}, {cron: "0 * * * *", timezone: Mars/Olympus}, {}]
  - {name: p, entrypoint: 5, parameters: [1], schedules: {cron: x}}
  - 7
""")
    assert main(["serve", "--list", "--prefect-file", str(deployments)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for expected in ("deployment 0: schedule 0: Prefect refuses it: Invalid cron string",
                     "deployment 0: schedule 1: interval: needs a number of seconds above 0",
                     "deployment 0: schedule 2: timezone: 'Mars/Olympus' is no IANA time zone",
                     "deployment 0: schedule 3: needs exactly one of 'cron' (text) or 'interval' (seconds)",
                     "deployment 1: needs 'entrypoint' (text)", "deployment 1: parameters: is not a mapping",
                     "deployment 1: schedules: is not a list", "deployment 2: is not a mapping"):
        assert expected in err, (expected, err)


def test_a_deployment_file_with_problems_of_several_kinds_is_refused_naming_them_all(tmp_path, capsys):
    """Its schedules were checked first, and refused alone: the user fixed one, reran, and met the
    next (an unknown setting, then the missing spec). Refused before serving: --list serves nothing."""
    deployments = tmp_path / "prefect.yaml"
    deployments.write_text("""deployments:
  - name: replan
    entrypoint: flows.replan.replan_flow
    parameters: {spec_path: no_such_spec.yaml, topology_path: ../topology.yaml, searching: {max_regres: 0.1}}
    schedules: [{cron: "*/99 * * *"}]
    shedule: {cron: "0 * * * *"}
""")
    assert main(["serve", "--list", "--prefect-file", str(deployments), "--limit", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardflow: Cannot serve the deployments:") and "Traceback" not in err
    for expected in ("--limit: must be at least 1",
                     "deployment 0: schedule 0: Prefect refuses it: Invalid cron string",
                     "deployment 0: shedule: is no key of a Prefect deployment, which Prefect (and serve) would "
                     "ignore: did you mean 'schedule'?",  # the deployment was served unscheduled
                     "replan: searching.max_regres: unknown setting",
                     f"spec_path: no such file: {tmp_path / 'no_such_spec.yaml'}",
                     f"topology_path: no such file: {tmp_path.parent / 'topology.yaml'}"):
        assert expected in err, (expected, err)


def test_a_deployment_is_served_with_what_prefect_deploy_reads_of_it(tmp_path, capsys):
    """Served as ``prefect deploy`` reads the file, where serve once dropped without a word: a
    deployment's one ``schedule:`` (served unscheduled), a schedule's ``active: false`` and a
    deployment's ``paused`` (both served running), a misspelled schedule key, and a deployment
    without a parameter its flow needs (its runs failed when triggered). The keys serve knows are
    the ones Prefect reads."""
    from prefect.cli.deploy._models import DeploymentConfig, RawScheduleConfig

    from flows.deployments import DEPLOYMENT_KEYS, SCHEDULE_KEYS
    from tests.paths import CPU_2PROC, DEMO

    assert set(DEPLOYMENT_KEYS) == set(DeploymentConfig.model_fields)
    assert set(SCHEDULE_KEYS) == set(RawScheduleConfig.model_fields)
    deployments = tmp_path / "prefect.yaml"
    inputs = f"{{spec_path: {DEMO}, topology_path: {CPU_2PROC}}}"
    deployments.write_text(f"""deployments:
  - name: replan
    entrypoint: flows.replan.replan_flow
    parameters: {inputs}
    schedule: {{cron: "0 * * * *"}}
    work_pool: {{name: for-workers-only}}
  - name: plan
    entrypoint: flows.plan.plan_flow
    parameters: {inputs}
    paused: true
    schedules: [{{interval: 60, active: false, anchor_date: "2026-01-01T00:00:00"}}]
""")
    assert main(["serve", "--list", "--prefect-file", str(deployments)]) == 0
    listed = capsys.readouterr().out
    assert "cron '0 * * * *'" in listed and "every 60 s (inactive) (paused)" in listed
    deployments.write_text(deployments.read_text().replace("active: false", "activ: false").replace(
        "    work_pool:", '    schedules: [{cron: "5 * * * *"}]\n    work_pool:') + f"""  - name: unplanned
    entrypoint: flows.plan.plan_flow
    parameters: {{spec_path: {DEMO}}}
  - name: plan
    entrypoint: flows.plan.plan_flow
    parameters: {inputs}
""")
    assert main(["serve", "--list", "--prefect-file", str(deployments)]) == 2
    err = capsys.readouterr().err
    for expected in ("schedule: given beside 'schedules', which Prefect refuses",
                     "schedule 0: activ: is no key of a schedule, which Prefect refuses (did you mean 'active'?)",
                     "unplanned: parameters: shardflow-plan needs 'topology_path' (it has no default)",
                     "plan: 2 deployments of flows.plan.plan_flow have this name: one would replace the others"):
        assert expected in err, (expected, err)
    # read as strictly as a spec: a key written twice (YAML keeps the last) is named
    deployments.write_text("deployments:\n  - name: a\n    name: b\n    entrypoint: flows.plan.plan_flow\n")
    assert main(["serve", "--list", "--prefect-file", str(deployments)]) == 2
    assert "the key 'name' is written twice" in capsys.readouterr().err


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


def test_a_served_runs_bad_input_is_logged_in_its_words_without_a_traceback(tmp_path):
    """A served run that failed on bad input once printed ~165 lines of tracebacks on every tick."""
    import logging
    import sys

    import yaml
    from prefect.settings import PREFECT_HOME, temporary_settings

    from flows.local_server import InputErrorsWithoutTraceback, _logging_settings_for_flow_runs
    from rec.errors import InputError, Problem

    def record_of(error: BaseException) -> logging.LogRecord:
        try:
            raise RuntimeError("Engine execution exited with unexpected exception") from error
        except RuntimeError:
            return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "run failed", None,
                                     sys.exc_info())

    bad = record_of(InputError("Invalid spec s.yaml:", [Problem("table x", "num_embeddings: must be >= 1")]))
    assert InputErrorsWithoutTraceback().filter(bad) and "Traceback" not in logging.Formatter().format(bad)
    fault = record_of(OSError("disk"))
    assert InputErrorsWithoutTraceback().filter(fault) and "Traceback" in logging.Formatter().format(fault)
    with temporary_settings(updates={PREFECT_HOME: tmp_path}):
        settings = yaml.safe_load(_logging_settings_for_flow_runs().read_text())
    assert "input_errors_without_traceback" in settings["handlers"]["console"]["filters"]


def test_serve_on_a_port_another_server_listens_on_is_refused_before_it_starts_one(tmp_path):
    """Its deployments once went to the other serve's server (which then ran them on this one's
    schedule) while its own server failed on the taken port."""
    import socket

    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from flows.local_server import port_taken, prefect_api
    from rec.errors import InputError

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert port_taken(port)
        with temporary_settings(updates={PREFECT_HOME: str(tmp_path)}, restore_defaults={PREFECT_API_URL}):
            with pytest.raises(InputError, match="Cannot start a local Prefect server") as refused:
                with prefect_api(port):
                    pass
        assert "the port is in use" in refused.value.render() and not list(tmp_path.iterdir())  # no log written
    assert not port_taken(port)
