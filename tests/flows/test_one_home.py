"""The CLI and the Prefect flows are two ways into the same step functions: same artifacts,
same options."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from flows.cli import main
from rec.train.config import TrainConfig
from tasks.train import TrainSettings
from tests.paths import CPU_2PROC, DEMO

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect


def test_cli_plan_and_prefect_plan_flow_write_identical_artifacts(prefect_api, tmp_path, capsys, mlflow_uri):
    from flows.plan import plan_flow

    assert main(["plan", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "cli")]) == 0
    outcome = plan_flow(str(DEMO), str(CPU_2PROC), out_dir=str(tmp_path / "flow"),
                        tracking_uri=mlflow_uri, state_dir=str(tmp_path / "state"))
    cli, flow = tmp_path / "cli", Path(outcome.plan_path).parent
    names = sorted(p.name for p in cli.iterdir() if not p.name.startswith("."))
    assert names == ["plan.json", "rank_load.png", "shards.parquet"]
    assert sorted(p.name for p in flow.iterdir() if not p.name.startswith(".")) == names
    for name in names:
        assert (cli / name).read_bytes() == (flow / name).read_bytes(), name
    assert json.loads((cli / "plan.json").read_text())["plan_id"] in capsys.readouterr().out


@pytest.mark.parametrize("flow_name", ["pipeline_flow", "train_flow"])
def test_the_flows_take_the_training_settings_whole_and_the_old_flat_names_only(flow_name):
    """Every training option of the CLI is a field of the flows' ``training``, defaults included;
    besides it, only the closed list of deprecated flat names of shardflow's first flows."""
    import flows.pipeline
    import flows.train
    from flows.parameters import DEPRECATED_TRAINING

    flow = getattr(flows.pipeline if flow_name == "pipeline_flow" else flows.train, flow_name)
    params = inspect.signature(flow.fn).parameters
    assert params["training"].default == TrainSettings()
    knob_names = {f.name for f in dataclasses.fields(TrainConfig)} | {f.name for f in dataclasses.fields(TrainSettings)}
    flat = {name for name in params if name in knob_names or name in DEPRECATED_TRAINING}
    expected = set(DEPRECATED_TRAINING) - ({"node_rank"} if flow_name == "pipeline_flow" else set())
    assert flat == expected  # the pipeline runs on node 0
    assert all(params[name].default is None for name in flat)  # None: not given


def test_the_deprecated_flat_parameters_set_every_field_they_name():
    """The flat parameters as the first flows took them give back the settings they stood for."""
    from flows.parameters import search_parameters, search_settings, with_deprecated
    from rec.cost.types import CostConfig, Optimizer
    from rec.errors import InputError
    from rec.search import SearchConfig
    from rec.train.config import PipelineKind
    from tasks.search import Backend, SearchSettings

    job = TrainConfig(iterations=7, warmup=2, batch_size=3, model="concat", pipeline=PipelineKind.NAIVE,
                      data="d.parquet", seed=5, dense_in_features=4, dense_arch_layer_sizes=(8,),
                      over_arch_layer_sizes=(4, 1), dense_lr=0.5, embedding_lr=0.25, synthetic_batches=3,
                      checkpoint_every=2, checkpoint_dir="ck", keep_checkpoints=2, resume=True, resume_from="r")
    training = TrainSettings(job=job, nproc_per_node=3, nnodes=2, node_rank=1, rdzv_endpoint="h:1", max_restarts=4)
    flat = dict(train_iterations=7, warmup=2, batch_size=3, model="concat", train_pipeline=PipelineKind.NAIVE,
                data="d.parquet", seed=5, dense_in_features=4, dense_arch_layer_sizes=(8,),
                over_arch_layer_sizes=(4, 1), dense_lr=0.5, embedding_lr=0.25, synthetic_batches=3,
                checkpoint_every=2, checkpoint_dir="ck", keep_checkpoints=2, resume=True, resume_from="r",
                nproc_per_node=3, nnodes=2, node_rank=1, rdzv_endpoint="h:1", max_restarts=4)
    assert with_deprecated(TrainSettings(), flat) == training
    assert with_deprecated(training, flat) == training  # the same value twice is no conflict
    assert with_deprecated(training, dict.fromkeys(flat)) == training  # None: not given
    with pytest.raises(InputError) as refused:  # given both ways, differently
        with_deprecated(training, {"train_iterations": 8})
    assert [(p.where, "training.job.iterations" in p.reason) for p in refused.value.problems] == [
        ("train_iterations", True)]
    searching = SearchSettings(Backend.RAY, 3, 0.5, CostConfig(Optimizer.SGD), SearchConfig(time_limit_s=2.0))
    assert search_settings(**search_parameters(searching), profile_path=None) == searching
