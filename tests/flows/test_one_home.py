"""The CLI and the Prefect flows are two ways into the same step functions: same artifacts,
same options."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from flows.cli import main
from tasks.train import TrainSettings
from tests.paths import CPU_2PROC, DEMO

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect


def test_cli_plan_and_prefect_plan_flow_write_identical_artifacts(prefect_api, tmp_path, capsys, mlflow_uri):
    from flows.plan import plan_flow
    from tasks.tracking import TrackingSettings

    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "cli")]) == 0
    outcome = plan_flow(str(DEMO), str(CPU_2PROC), out_dir=str(tmp_path / "flow"),
                        tracking=TrackingSettings(mlflow_uri, state_dir=str(tmp_path / "state")))
    cli, flow = tmp_path / "cli", Path(outcome.plan_path).parent
    names = sorted(p.name for p in cli.iterdir() if not p.name.startswith("."))
    assert names == ["plan.json", "rank_load.png", "shards.parquet"]
    assert sorted(p.name for p in flow.iterdir() if not p.name.startswith(".")) == names
    for name in names:
        assert (cli / name).read_bytes() == (flow / name).read_bytes(), name
    assert json.loads((cli / "plan.json").read_text())["plan_id"] in capsys.readouterr().out


FLOWS = ("plan_flow", "pipeline_flow", "replan_flow", "train_flow")


def knob_names(cls: type) -> set[str]:
    """The names of every field of settings ``cls``, nested settings' included."""
    import typing

    out = set()
    for f in dataclasses.fields(cls):
        out.add(f.name)
        tp = typing.get_type_hints(cls)[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out |= knob_names(tp)
    return out


@pytest.mark.parametrize("flow_name", FLOWS)
def test_the_flows_take_the_search_training_and_tracking_settings_whole(flow_name):
    """Every search, training and tracking option of the CLI is a field of the flows' ``searching``,
    ``training`` or ``tracking``, defaults included; no knob is a flow parameter of its own."""
    import importlib

    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings

    flow = getattr(importlib.import_module(f"flows.{flow_name.removesuffix('_flow')}"), flow_name)
    params = inspect.signature(flow.fn).parameters
    settings = {"searching": SearchSettings, "training": TrainSettings, "tracking": TrackingSettings}
    taken = {name: cls for name, cls in settings.items() if name in params}
    assert set(taken) == ({"training", "tracking"} if flow_name == "train_flow" else
                          {"searching", "training", "tracking"} if flow_name == "pipeline_flow" else
                          {"searching", "tracking"})
    assert {name: params[name].default for name in taken} == {name: cls() for name, cls in taken.items()}
    assert set(params) & set().union(*map(knob_names, settings.values())) == set()


def test_the_pipeline_flow_has_at_most_twelve_parameters():
    from flows.pipeline import pipeline_flow

    assert len(inspect.signature(pipeline_flow.fn).parameters) <= 12
