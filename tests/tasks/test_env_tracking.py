"""What a user's shell leaves in the environment for MLflow is checked as the flags are: a tracking
URI or an experiment no run could go to, and MLflow's own settings MLflow cannot read, are refused
before any work, naming the variable; the experiment it names is the one used."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import HTTPServer, SimpleHTTPRequestHandler

import pytest

from flows.cli import main
from rec.errors import InputError
from tasks.outbox import Outbox
from tasks.recorder import record
from tasks.records import RunRecord, RunStep, new_key, now_ms
from tasks.tracking import Tracking, TrackingSettings, tracking_for
from tasks.tracking.settings import _mlflow_variables

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow


@pytest.fixture(autouse=True)
def no_mlflow_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_HTTP_REQUEST_TIMEOUT",
                 "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def plain_http_server() -> Iterator[str]:
    """A web server on 127.0.0.1 that is no MLflow (it answers every API call 404 or 501)."""
    server = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def refusal(**settings: object) -> str:
    """Why the settings are refused as a command resolves them before its work."""
    made = TrackingSettings(**settings)  # type: ignore[arg-type]  # made alike whatever the environment
    with pytest.raises(InputError) as raised:
        made.resolve()
    return raised.value.render()


@pytest.mark.parametrize("uri, why", [("sqlite://", "is an in-memory SQLite database"),
                                      ("file:///tmp/runs", "is a file store"), ("mlruns", "is a file store")])
def test_a_tracking_uri_from_the_environment_no_run_could_reach_is_refused_naming_the_variable(monkeypatch, uri, why):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert f"MLFLOW_TRACKING_URI={uri}: {why}" in refusal()
    with pytest.raises(InputError):  # what every flow starts with
        tracking_for()


def test_a_command_refuses_the_environments_in_memory_store_with_exit_2_before_it_reads_anything(
        monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite://")
    assert main(["compare"]) == 2
    err = capsys.readouterr().err
    assert "MLFLOW_TRACKING_URI=sqlite://: is an in-memory SQLite database" in err
    assert "Traceback" not in err


def test_plan_refuses_the_environments_in_memory_store_before_it_searches_or_writes(monkeypatch, capsys, tmp_path):
    """As a --tracking-uri flag of that value is: the plan was searched, shown and written, then exit 2."""
    from tests.paths import CPU_2PROC, DEMO

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite://")
    assert main(["plan", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "plan"),
                 "--state-dir", str(tmp_path / "state")]) == 2
    out, err = capsys.readouterr()
    assert "MLFLOW_TRACKING_URI=sqlite://: is an in-memory SQLite database" in err and "Traceback" not in err
    assert not (tmp_path / "plan").exists() and "critical path" not in out


def test_the_flag_wins_over_the_environment_and_no_track_never_reads_it(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite://")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "../x")
    given = TrackingSettings(tracking_uri=f"sqlite:///{tmp_path}/m.db", experiment="mine").resolve()
    assert (given.uri, given.experiment) == (f"sqlite:///{tmp_path}/m.db", "mine")
    TrackingSettings(track=False).resolve()  # --no-track: MLflow is not used


def test_the_flows_default_settings_are_made_whatever_the_environment_and_a_flag_still_wins(monkeypatch,
                                                                                           tmp_path):
    """The flows' default parameters are made as their modules are imported: a bad MLFLOW_* variable once
    failed that import (and serve, and every deployment's flow run), and refused `run --experiment good`."""
    import subprocess
    import sys

    env = {**os.environ, "MLFLOW_EXPERIMENT_NAME": "bad/name", "MLFLOW_HTTP_REQUEST_TIMEOUT": "abc"}
    r = subprocess.run([sys.executable, "-c", "import flows.pipeline, flows.train, flows.plan, flows.replan"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "bad/name")
    assert TrackingSettings(experiment="good", tracking_uri=f"sqlite:///{tmp_path}/m.db").resolve().experiment == "good"


def test_mlflow_settings_mlflow_cannot_read_are_refused_up_front_each_in_one_line(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "abc")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "maybe")
    shown = refusal()
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT=abc: MLflow reads this variable as a whole number" in shown
    assert "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=maybe: MLflow reads this variable as true, false, 1 or 0" in shown
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    TrackingSettings()


def test_listing_the_outbox_and_reading_its_entries_ignore_mlflows_settings(monkeypatch, tmp_path, capsys):
    """Neither needs MLflow: a bad MLflow variable refused `outbox list`, and would have set aside every
    entry whose destination was read under it."""
    from tasks.outbox_entry import read_destination

    (tmp_path / "to.json").write_text('{"uri": "sqlite:////tmp/elsewhere.db", "experiment": "x"}')
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "abc")
    assert main(["outbox", "list", "--state-dir", str(tmp_path / "state")]) == 0
    assert "nothing waits in" in capsys.readouterr().out
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert read_destination(fd, tmp_path).experiment == "x"
    finally:
        os.close(fd)


def test_the_variables_checked_are_those_of_the_installed_mlflow():
    """Pinned to MLflow: its table of variables is read without importing MLflow."""
    import mlflow.environment_variables as defined

    checked = {v.name: v.type for v in _mlflow_variables()}
    assert checked["MLFLOW_HTTP_REQUEST_TIMEOUT"] is int
    assert set(checked) == {v.name for v in vars(defined).values()
                            if isinstance(v, defined._EnvironmentVariable)}


def test_a_delivery_that_fails_for_a_reason_nobody_foresaw_keeps_the_record_waiting_with_one_line(
        monkeypatch, plain_http_server, tmp_path):
    """An MLflow setting that goes bad after the checks (MLflow reads it only as it records): the
    work is done, so the record waits in the outbox with the reason, and nothing raises."""
    outbox = Outbox(tmp_path / "outbox")
    tracking = Tracking(plain_http_server, "shardflow", str(outbox.root))
    outbox.put(RunRecord(key=new_key(), step=RunStep.TRAIN, name="train-test", start_ms=now_ms(), end_ms=now_ms(),
                         tags={"shardflow.step": "train"}))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "abc")
    delivery = outbox.deliver(tracking)
    assert delivery.pending == 1 and delivery.error is not None
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" in delivery.error and "\n" not in delivery.error
    [waiting] = outbox.describe()
    assert not waiting.set_aside and "MLFLOW_HTTP_REQUEST_TIMEOUT" in (waiting.last_error or "")


def test_the_experiment_mlflow_experiment_name_names_gets_the_runs(monkeypatch, mlflow_uri):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team runs")
    tracking = TrackingSettings(tracking_uri=mlflow_uri).resolve()
    assert tracking.experiment == "team runs"
    logged = record(tracking, RunRecord(key=new_key(), step=RunStep.TRAIN, name="train-test", start_ms=now_ms(),
                                        end_ms=now_ms(), tags={"shardflow.step": "train"}))
    assert logged.run_id is not None
    run = MlflowClient(mlflow_uri).get_run(logged.run_id)
    assert MlflowClient(mlflow_uri).get_experiment(run.info.experiment_id).name == "team runs"


def test_an_experiment_name_from_the_environment_that_is_no_plain_name_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "../x")
    assert "MLFLOW_EXPERIMENT_NAME=../x: contains a path separator" in refusal()
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    assert TrackingSettings().resolve().experiment == "shardflow"
