"""``train_flow`` on real Prefect and torchrun: checkpointing and resuming, as with ``shardflow train``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "specs" / "cpu_demo.yaml"
CPU_2PROC = ROOT / "examples" / "topologies" / "cpu_2proc.yaml"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect


def test_prefect_training_checkpoints_and_a_later_run_resumes_from_it(prefect_api, tmp_path):
    from flows.train import train_flow

    assert main(["plan", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "plan"),
                 "--no-chart"]) == 0
    common = dict(plan_path=str(tmp_path / "plan" / "plan.json"), warmup=1, batch_size=32,
                  checkpoint_every=3, keep_checkpoints=1, out_dir=str(tmp_path / "out"),
                  tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", state_dir=str(tmp_path / "state"))
    first = train_flow(train_iterations=6, **common)
    checkpoints = tmp_path / "out" / "train" / "checkpoints"
    assert first.trained.metrics["resumed_from"] == 0
    assert (checkpoints / "LATEST").read_text() == "step_00000006"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_00000006"]  # kept 1

    second = train_flow(train_iterations=9, resume=True, **common)
    metrics = json.loads((tmp_path / "out" / "train" / "train_metrics.json").read_text())
    assert second.trained.metrics["resumed_from"] == metrics["resumed_from"] == 6
    assert (checkpoints / "LATEST").read_text() == "step_00000009"
    assert second.logged is not None and second.logged.run_id


def test_a_certain_failure_is_not_retried_by_prefect(prefect_api, tmp_path):
    import time

    import torch

    from flows.train import train_flow
    from rec.errors import InputError

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    H100 = ROOT / "examples" / "topologies" / "h100_1x8.yaml"
    assert main(["plan", str(DEMO), "--topology", str(H100), "--out", str(tmp_path / "plan"), "--no-chart"]) == 0
    started = time.monotonic()
    with pytest.raises(InputError, match=r"without CUDA|no CUDA device"):
        train_flow(plan_path=str(tmp_path / "plan" / "plan.json"), train_retries=2, train_retry_delay_s=10,
                   out_dir=str(tmp_path / "out"), tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                   state_dir=str(tmp_path / "state"))
    assert time.monotonic() - started < 10  # a retry would wait 10 s first
