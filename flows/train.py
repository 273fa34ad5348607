"""``train_flow``: step 4 alone — train with an existing plan (a path, or a plan_id from MLflow)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.tasks import exponential_backoff

from rec.errors import InputError, Problem
from tasks.mlflow_log import Logged, deliver_outbox, fetch_plan_task, log_training
from tasks.tracking import DEFAULT_EXPERIMENT, DEFAULT_STATE_DIR, tracking_for
from tasks.training import Trained, TrainSettings, launch_training

DEFAULT_OUT = "out"
TrainPipeline = Literal["sparse_dist", "naive"]
Model = Literal["auto", "dlrm", "dlrm_dcn", "concat"]


@dataclass(frozen=True)
class TrainOutcome:
    plan_id: str
    plan_path: str
    trained: Trained
    logged: Logged | None  # None on nodes other than node 0: rank 0 reports


def train_with_retries(plan_path: str, settings: TrainSettings, out_dir: str, retries: int,
                       retry_delay_s: float) -> Trained:
    """``launch_training`` with the flow's retry policy: exponential backoff from retry_delay_s."""
    launch = launch_training.with_options(
        retries=retries, retry_delay_seconds=exponential_backoff(backoff_factor=retry_delay_s))
    return launch(plan_path, settings, out_dir)


@flow(name="shardflow-train")
def train_flow(
    plan_path: str | None = None,
    plan_id: str | None = None,
    train_iterations: int = 100,
    warmup: int = 10,
    batch_size: int | None = None,
    nproc_per_node: int | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    max_restarts: int = 0,
    train_pipeline: TrainPipeline = "sparse_dist",
    model: Model = "auto",
    data: str | None = None,
    train_retries: int = 2,
    train_retry_delay_s: float = 10.0,
    out_dir: str = DEFAULT_OUT,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    state_dir: str = DEFAULT_STATE_DIR,
) -> TrainOutcome:
    """Train with ``plan_path``, or with the plan ``plan_id`` fetched from MLflow; never plans."""
    if (plan_path is None) == (plan_id is None):
        raise InputError("train_flow needs a plan:", [Problem("plan_path / plan_id", "give exactly one")])
    tracking = tracking_for(tracking_uri, experiment, state_dir)
    settings = TrainSettings(train_iterations, warmup, batch_size, nproc_per_node, nnodes, node_rank,
                             rdzv_endpoint, max_restarts, train_pipeline, model, data)
    train_dir = str(Path(out_dir, "train"))
    deliver_outbox(tracking)

    if plan_id is not None:
        plan_path = fetch_plan_task(tracking, plan_id, str(Path(train_dir, "plan")))
    trained = train_with_retries(plan_path, settings, train_dir, train_retries, train_retry_delay_s)
    logged = log_training(tracking, trained) if node_rank == 0 else None
    return TrainOutcome(trained.plan_id, plan_path, trained, logged)
