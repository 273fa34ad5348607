"""What a train or plan record says against the files shardflow wrote (plan.json, train_metrics.json,
iterations.parquet): built from those files as the commands build them, without a training, and
delivered to a real MLflow on a temporary SQLite file where what MLflow keeps matters."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from tasks import records

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow

EVALUATION: dict[str, float | int | None] = {"samples": 10, "auc": 0.7, "logloss": 0.5, "ne": 0.9}


@pytest.fixture(scope="module")
def plan_path(demo_inputs, tmp_path_factory) -> Path:
    """The demo's plan (two CPU ranks on one node), written as ``shardflow plan --no-track`` writes it:
    MLflow has no plan run of it."""
    from rec.plan.io import write_plan
    from rec.planning import plan_spec

    return Path(write_plan(plan_spec(demo_inputs.spec, demo_inputs.topology), tmp_path_factory.mktemp("plan")))


def trained(plan_path: Path, out: Path, settings=None, iterations: int = 10, restarts: int = 0,
            evaluations: tuple[int, ...] = ()):
    """A training of the plan as node 0 of ``shardflow train`` leaves it, evaluated after each of
    ``evaluations`` iterations."""
    from rec.plan import read_plan
    from rec.train.metrics import Iterations, LatencyStats, LossStats, TrainMetrics, read_metrics, write_metrics
    from tasks.train import Trained, TrainSettings

    plan = read_plan(plan_path)
    stats = LatencyStats(2.0, 3.0, 4.0, 2.5)
    metrics = TrainMetrics(plan.plan_id, 2, iterations, 1, 32, "sparse_dist", "concat", stats,
                           LossStats(0.7, 0.5, 0.6), 1000.0, {}, 0, restarts=restarts,
                           eval=EVALUATION if evaluations else None,
                           evaluations=tuple({"iteration": i, **EVALUATION} for i in evaluations))
    write_metrics(out, metrics, Iterations.of_run(0, np.ones(iterations), np.ones(iterations), 1))
    return Trained(plan.plan_id, str(out), read_metrics(out), settings or TrainSettings(), 2, 1, 0, str(plan_path))


def delivered(uri: str, tmp_path: Path, rec: records.RunRecord):
    """The MLflow run of ``rec``, recorded as the commands record it."""
    from mlflow import MlflowClient

    from tasks.recorder import record
    from tasks.tracking import TrackingSettings

    logged = record(TrackingSettings(uri, state_dir=str(tmp_path / "state")).resolve(), rec, {})
    assert logged.run_id, logged
    return MlflowClient(uri).get_run(logged.run_id)


def test_a_failed_training_carries_its_plans_tags_and_params_and_compare_finds_it_by_spec_hash(
        plan_path, mlflow_uri, tmp_path):
    from flows.cli import main
    from rec.plan import read_plan
    from tasks.train import TrainSettings

    plan = read_plan(plan_path)
    failed = records.failed_train_record(plan.plan_id, TrainSettings(), "ranks 0-1: boom", 1, records.now_ms(),
                                         (), plan_path=str(plan_path))
    finished = records.train_record(trained(plan_path, tmp_path / "train"))
    plan_tags = {records.SPEC_HASH, records.TOPOLOGY_HASH}
    assert {k: failed.tags[k] for k in plan_tags} == {k: finished.tags[k] for k in plan_tags}
    assert failed.tags[records.SPEC_HASH] == plan.spec_hash
    plan_params = records.plan_params(plan)
    assert {k: failed.params[k] for k in plan_params} == {k: finished.params[k] for k in plan_params} == plan_params

    run = delivered(mlflow_uri, tmp_path, failed)
    assert run.info.status == "FAILED" and run.data.params["spec.hash"] == plan.spec_hash
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["compare", "--tracking-uri", mlflow_uri, "--state-dir", str(tmp_path / "state"), "--wide",
                     "--spec-hash", plan.spec_hash])
    assert code == 0, out.getvalue()
    assert f"FAILED training of plan {plan.plan_id}" in out.getvalue()


def test_every_train_record_names_the_processes_each_node_started(plan_path, tmp_path):
    from rec.plan import read_plan
    from tasks.train import TrainSettings

    local = str(read_plan(plan_path).topology.local_world_size)
    failed = records.failed_train_record("0" * 16, TrainSettings(), "boom", 1, 0, (), plan_path=str(plan_path))
    given = records.failed_train_record("0" * 16, TrainSettings(nproc_per_node=2), "boom", 1, 0, (),
                                        plan_path=str(plan_path))
    finished = records.train_record(trained(plan_path, tmp_path / "train"))
    assert failed.params["nproc_per_node"] == given.params["nproc_per_node"] == local == "2"
    assert finished.params["nproc_per_node"] == local


def test_evaluations_are_stepped_as_the_iterations_they_followed(plan_path, mlflow_uri, tmp_path):
    from mlflow import MlflowClient

    rec = records.train_record(trained(plan_path, tmp_path / "train", iterations=10, evaluations=(5, 10)))
    steps = [step for step, _ in rec.series[records.LATENCY_SERIES]]
    assert steps == list(range(10))
    assert [step for step, _ in rec.series["eval_auc"]] == [4, 9]  # after the 5th and the 10th iteration

    client, run = MlflowClient(mlflow_uri), delivered(mlflow_uri, tmp_path, rec)
    logged = {p.step for p in client.get_metric_history(run.info.run_id, "eval_ne")}
    assert logged == {4, 9} and logged <= {p.step for p in client.get_metric_history(run.info.run_id,
                                                                                     records.LOSS_SERIES)}


def test_a_param_longer_than_mlflow_takes_is_cut_with_a_mark_of_its_length(plan_path, mlflow_uri, tmp_path):
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    from rec.train.config import TrainConfig
    from tasks.train import TrainSettings

    assert records.MAX_PARAM == MAX_PARAM_VAL_LENGTH
    data = ",".join(f"s3://bucket/part-{i:05d}.parquet" for i in range(300))  # 8699 characters
    settings = TrainSettings(job=TrainConfig(data=data))
    rec = records.train_record(trained(plan_path, tmp_path / "train", settings))
    cut = rec.params["data"]
    assert len(cut) == MAX_PARAM_VAL_LENGTH and cut.endswith(f"... ({len(data)} characters)")
    assert data.startswith(cut[: cut.rindex("... (")])
    assert records.loads_record(records.dumps_record(rec)).params == rec.params  # the outbox holds it cut
    assert delivered(mlflow_uri, tmp_path, rec).data.params["data"] == cut
    end = records.EndRecord(rec.key, records.RunStatus.FINISHED, 0, params={"eval_data": data, "seed": "1"})
    assert end.params == {"eval_data": cut, "seed": "1"}
    exact = "x" * MAX_PARAM_VAL_LENGTH
    assert records.cut_params({"data": exact}) == {"data": exact}


def test_restarts_after_a_rank_died_are_recorded(plan_path, mlflow_uri, tmp_path):
    rec = records.train_record(trained(plan_path, tmp_path / "train", restarts=2))
    assert delivered(mlflow_uri, tmp_path, rec).data.metrics["restarts"] == 2.0
    assert records.train_record(trained(plan_path, tmp_path / "again")).metrics["restarts"] == 0.0


def test_a_model_targets_training_is_not_said_to_be_on_synthetic_data(plan_path, tmp_path):
    from rec.train.config import TrainConfig
    from tasks.train import TrainSettings

    own = TrainSettings(job=TrainConfig(model="my_models.ctr:build"))
    rec = records.train_record(trained(plan_path, tmp_path / "train", own))
    assert rec.params["data"] == records.MODEL_BATCHES
    failed = records.failed_train_record("0" * 16, own, "boom", 1, 0, (), plan_path=str(plan_path))
    assert failed.params["data"] == records.MODEL_BATCHES
    assert records.train_record(trained(plan_path, tmp_path / "synthetic")).params["data"] == "synthetic"


def test_planning_time_is_recorded_unrounded(plan_path, demo_inputs):
    from rec.plan import read_plan

    rec = records.plan_record(read_plan(plan_path), demo_inputs, planning_s=0.123456789)
    assert rec.metrics["planning_s"] == 0.123456789


def test_iterations_without_a_loss_are_left_out_of_the_loss_series_not_sent_as_nan(plan_path, tmp_path):
    """The rows an early shardflow's training kept without a loss (NaN), resumed by this one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = trained(plan_path, tmp_path / "train")
    path = tmp_path / "train" / "iterations.parquet"
    table = pq.read_table(path)
    loss = np.array(table.column("loss").to_numpy())
    loss[:4] = np.nan
    pq.write_table(table.set_column(table.schema.get_field_index("loss"), "loss", pa.array(loss)), path)
    series = records.train_record(done).series
    assert [i for i, _ in series[records.LOSS_SERIES]] == list(range(4, 10))
    assert len(series[records.LATENCY_SERIES]) == 10
