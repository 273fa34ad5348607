"""``train_flow`` on real Prefect and torchrun: checkpointing and resuming, as with ``shardflow train``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flows.cli import main
from rec.train.resume import step_name, step_of
from tests.paths import CPU_2PROC, DEMO, H100

pytestmark = [pytest.mark.slow,  # Prefect and real torchrun trainings
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # SQLAlchemy, from MLflow+Prefect


def test_prefect_training_checkpoints_and_a_later_run_resumes_from_it(prefect_api, tmp_path, mlflow_uri, capfd):
    from flows.train import train_flow
    from rec.train.config import TrainConfig
    from tasks.tracking import TrackingSettings
    from tasks.train import TrainSettings

    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "plan"),
                 "--no-chart"]) == 0
    common = dict(plan_path=str(tmp_path / "plan" / "plan.json"), out_dir=str(tmp_path / "out"),
                  tracking=TrackingSettings(mlflow_uri, state_dir=str(tmp_path / "state")))
    job = TrainConfig(iterations=6, warmup=1, batch_size=32, checkpoint_every=3, keep_checkpoints=1, resume=True)
    first = train_flow(training=TrainSettings(job=job), **common)  # nothing to resume yet: it says so, and starts
    checkpoints = tmp_path / "out" / "train" / "checkpoints"
    assert first.trained.metrics.resumed_from == 0
    assert f"resume    no complete checkpoint in {checkpoints} (no LATEST): training from iteration 0" \
        in capfd.readouterr().err
    assert (checkpoints / "LATEST").read_text() == step_name(6)
    assert [p.name for p in checkpoints.iterdir() if step_of(p.name) is not None] == [step_name(6)]  # kept 1

    second = train_flow(training=TrainSettings(job=dataclasses.replace(job, iterations=9)), **common)
    metrics = json.loads((tmp_path / "out" / "train" / "train_metrics.json").read_text())
    assert second.trained.metrics.resumed_from == metrics["resumed_from"] == 6
    assert (checkpoints / "LATEST").read_text() == step_name(9)
    assert second.logged is not None and second.logged.run_id


def test_a_certain_failure_is_not_retried_by_prefect(prefect_api, tmp_path, mlflow_uri):
    import torch
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.train import train_flow
    from rec.errors import InputError
    from tasks.tracking import TrackingSettings

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(H100), "--out", str(tmp_path / "plan"),
                 "--no-chart"]) == 0
    state = train_flow(plan_path=str(tmp_path / "plan" / "plan.json"), train_retries=2, train_retry_delay_s=0,
                       out_dir=str(tmp_path / "out"),
                       tracking=TrackingSettings(mlflow_uri, state_dir=str(tmp_path / "state")), return_state=True)
    with pytest.raises(InputError, match=r"without CUDA|no CUDA device"):
        state.result()
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[
            state.state_details.flow_run_id])))
    (launch,) = [run for run in runs if run.name.startswith("launch-training")]
    assert launch.run_count == 1  # not retried, though two retries were allowed
