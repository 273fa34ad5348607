"""The CLI and the Prefect flows are two ways into the same step functions: same artifacts,
same options."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from flows.cli import main
from flows.parameters import parameter
from rec.train.config import TrainConfig
from tasks.train import TrainSettings
from tests.paths import CPU_2PROC, DEMO

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect


def test_cli_plan_and_prefect_plan_flow_write_identical_artifacts(prefect_api, tmp_path, capsys):
    from flows.plan import plan_flow

    assert main(["plan", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "cli")]) == 0
    outcome = plan_flow(str(DEMO), str(CPU_2PROC), out_dir=str(tmp_path / "flow"),
                        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", state_dir=str(tmp_path / "state"))
    cli, flow = tmp_path / "cli", Path(outcome.plan_path).parent
    names = sorted(p.name for p in cli.iterdir() if not p.name.startswith("."))
    assert names == ["plan.json", "rank_load.png", "shards.parquet"]
    assert sorted(p.name for p in flow.iterdir() if not p.name.startswith(".")) == names
    for name in names:
        assert (cli / name).read_bytes() == (flow / name).read_bytes(), name
    assert json.loads((cli / "plan.json").read_text())["plan_id"] in capsys.readouterr().out


@pytest.mark.parametrize("flow_name", ["pipeline_flow", "train_flow"])
def test_every_training_option_of_the_cli_is_a_flow_parameter(flow_name):
    import flows.pipeline
    import flows.train

    flow = getattr(flows.pipeline if flow_name == "pipeline_flow" else flows.train, flow_name)
    params = inspect.signature(flow.fn).parameters
    expected = [parameter(f.name) for f in dataclasses.fields(TrainConfig)]
    expected += [f.name for f in dataclasses.fields(TrainSettings) if f.name != "job"]
    if flow_name == "pipeline_flow":
        expected.remove("node_rank")  # the pipeline runs on node 0
    assert [p for p in expected if p not in params] == []
    for field in dataclasses.fields(TrainConfig):
        assert params[parameter(field.name)].default == field.default, field.name


def test_flow_parameters_give_back_every_setting_they_were_made_from():
    """The flows build their settings with every parameter named (no ``locals()``): a field the
    builder forgot would come back at its default."""
    from flows.parameters import search_parameters, search_settings, train_parameters, train_settings
    from rec.cost.types import CostConfig, Optimizer
    from rec.search import SearchConfig
    from rec.train.config import PipelineKind
    from tasks.search import Backend, SearchSettings

    job = TrainConfig(iterations=7, warmup=2, batch_size=3, model="concat", pipeline=PipelineKind.NAIVE,
                      data="d.parquet", seed=5, dense_in_features=4, dense_arch_layer_sizes=(8,),
                      over_arch_layer_sizes=(4, 1), dense_lr=0.5, embedding_lr=0.25, synthetic_batches=3,
                      checkpoint_every=2, checkpoint_dir="ck", keep_checkpoints=2, resume=True, resume_from=None)
    training = TrainSettings(job=job, nproc_per_node=3, nnodes=2, node_rank=1, rdzv_endpoint="h:1", max_restarts=4)
    assert {f.name for f in dataclasses.fields(job) if getattr(job, f.name) == f.default} <= {"resume_from"}
    assert train_settings(**train_parameters(training)) == training
    searching = SearchSettings(Backend.RAY, 3, 0.5, CostConfig(Optimizer.SGD), SearchConfig(time_limit_s=2.0))
    assert search_settings(**search_parameters(searching), profile_path=None) == searching
