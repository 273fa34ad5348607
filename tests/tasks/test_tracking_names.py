"""Names that reach a path — the MLflow experiment, a plan_id — are checked wherever they come
from (flags, flow and deployment parameters), and the artifact directory stays inside mlruns/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flows.cli import main
from rec.errors import InputError
from tasks.tracking import Tracking, TrackingSettings, connect, tracking_for
from tests.paths import CPU_2PROC, DEMO

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow

BAD_EXPERIMENTS = {
    "../../x": "path separator",
    "/tmp/elsewhere": "path separator",
    "a\\b": "path separator",
    "..": "not a name",
    "": "is empty",
    "   ": "is empty",
    "a\x00b": "NUL",
    "a\nb": "control characters",
    " padded": "white space",
    "x" * 300: "longer than 255 bytes",
}


@pytest.mark.parametrize("name", list(BAD_EXPERIMENTS))
def test_an_experiment_name_that_is_no_plain_name_is_refused_naming_why(name):
    with pytest.raises(InputError) as raised:
        TrackingSettings(experiment=name)
    assert BAD_EXPERIMENTS[name] in raised.value.render()
    with pytest.raises(InputError):  # what every flow starts with
        tracking_for(None, name)


def test_plain_names_with_spaces_dots_and_unicode_are_fine():
    for name in ("shardflow", "team a", "v1.2_run-3", "Experiment über alles"):
        assert TrackingSettings(experiment=name).resolve().experiment == name


@pytest.mark.parametrize("flow_name", ["plan_flow", "pipeline_flow", "replan_flow", "train_flow"])
def test_every_flow_refuses_the_name_before_it_does_anything(flow_name, tmp_path):
    """A deployment's (or the UI's) ``tracking`` is made into ``TrackingSettings`` as Prefect
    validates the flow's parameters: a bad name fails there, before the flow runs. The flows
    always record: ``track: false`` fails as the flow starts."""
    import flows.pipeline
    import flows.plan
    import flows.replan
    import flows.train

    module = {"plan_flow": flows.plan, "pipeline_flow": flows.pipeline, "replan_flow": flows.replan,
              "train_flow": flows.train}[flow_name]
    flow = getattr(module, flow_name)
    inputs = {"plan_path": str(tmp_path / "plan.json")} if flow_name == "train_flow" else \
        {"spec_path": str(DEMO), "topology_path": str(CPU_2PROC)}
    state = str(tmp_path / "state")
    with pytest.raises(InputError, match="path separator"):
        flow.validate_parameters({**inputs, "tracking": {"experiment": "../../escaped", "state_dir": state},
                                  "out_dir": str(tmp_path / "out")})
    with pytest.raises(InputError, match="the flows always record"):
        flow.fn(**inputs, tracking=TrackingSettings(state_dir=state, track=False), out_dir=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists()


def test_a_plan_id_that_is_no_plan_id_is_refused_before_it_names_a_directory(tmp_path):
    import flows.train

    with pytest.raises(InputError, match="is not a plan_id"):
        flows.train.train_flow.fn(plan_id="../../x", out_dir=None,
                                  tracking=TrackingSettings(state_dir=str(tmp_path / "state")))


def test_the_cli_exits_2_naming_the_experiment_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--plan-only", str(DEMO), "--topology", str(CPU_2PROC), "--experiment", "../../x"])
    err = capsys.readouterr().err
    assert code == 2 and "experiment '../../x'" in err and "path separator" in err
    assert list(tmp_path.iterdir()) == []  # no state, no output, no store
    code = main(["train", "--plan-id", "../../x", "--no-track"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a plan_id" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
    code = main(["train", "--plan-id", "0123456789abcdef", "--no-track"])  # a lookup once made ./mlflow.db
    err = capsys.readouterr().err
    assert code == 2 and "Cannot find plan 0123456789abcdef" in err and "no MLflow store at" in err
    assert list(tmp_path.iterdir()) == []


def test_an_unchecked_name_still_keeps_its_artifacts_inside_mlruns(tmp_path):
    """A library caller can build Tracking without the settings: the location is safe anyway."""
    store = tmp_path / "store"
    store.mkdir()
    client, experiment_id = connect(Tracking(f"sqlite:///{store / 'mlflow.db'}", "../../outside"))
    location = client.get_experiment(experiment_id).artifact_location
    assert Path(location.removeprefix("file://")).parent == store / "mlruns"
    shutil.rmtree(store)


def test_a_sqlite_store_whose_path_sqlite_cannot_open_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """In a working directory deeper than ~500 bytes (three folders of 60 CJK characters) the default store
    could never be opened: every command said "MLflow unavailable ... delivered by the next run", which
    never came, and `outbox retry` failed for good."""
    deep = tmp_path / "/".join(["漢" * 60] * 3)
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(InputError) as refused:
        TrackingSettings()
    (problem,) = refused.value.problems
    assert "its SQLite file's path is" in problem.reason and "SQLite opens paths of up to 504" in problem.reason
    assert not TrackingSettings(track=False).track  # --no-track needs no store
    short = tmp_path / "mlflow.db"
    assert TrackingSettings(tracking_uri=f"sqlite:///{short}").resolve().uri == f"sqlite:///{short}"
