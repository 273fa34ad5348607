"""``train_flow``: step 4 alone — train with an existing plan (a path, or a plan_id from MLflow).

A training that fails for good (after torchrun's restarts and Prefect's retries) leaves a FAILED
MLflow train run with the cause (``shardflow.error``) and the ranks' logs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import flow
from prefect.tasks import exponential_backoff

from flows.start import started
from rec.errors import InputError, Problem
from rec.plan import read_plan
from tasks.clock import now_ms
from tasks.mlflow_log import Logged, ParentRun, fetch_plan_task, log_failed_training, log_training
from tasks.paths import PLAN_SUBDIR
from tasks.plan_fetch import check_plan_id
from tasks.records import error_tag
from tasks.run_dirs import RunDirs
from tasks.steps import train_task
from tasks.tracking import Tracking, TrackingSettings
from tasks.train import TRAIN_RETRIES, TRAIN_RETRY_DELAY_S, Trained, TrainingFailed, TrainSettings


@dataclass(frozen=True)
class TrainOutcome:
    plan_id: str
    plan_path: str
    trained: Trained
    logged: Logged | None  # None on nodes other than node 0: rank 0 reports


def train_with_retries(plan_id: str, plan_path: str, out_dir: str, settings: TrainSettings, retries: int,
                       retry_delay_s: float, tracking: Tracking, parent: ParentRun | None = None) -> Trained:
    """``train_task`` with the flow's retry policy (exponential backoff from retry_delay_s); a
    training that fails for good is recorded as a FAILED train run (by node 0) before it raises."""
    launch = train_task.with_options(
        retries=retries, retry_delay_seconds=exponential_backoff(backoff_factor=retry_delay_s))
    started = now_ms()
    try:
        return launch(plan_path, out_dir, settings)
    except TrainingFailed as e:
        if settings.node_rank == 0:
            log_failed_training(tracking, plan_id, settings, out_dir, error_tag(e), e.attempt, started, parent,
                                plan_path)
        raise


@flow(name="shardflow-train")
def train_flow(
    plan_path: str | None = None,
    plan_id: str | None = None,
    training: TrainSettings = TrainSettings(),
    train_retries: int = TRAIN_RETRIES,
    train_retry_delay_s: float = TRAIN_RETRY_DELAY_S,
    out_dir: str | None = None,
    tracking: TrackingSettings = TrackingSettings(),
    work_dir: str | None = None,
) -> TrainOutcome:
    """Train as ``training`` says with ``plan_path``, or with the plan ``plan_id`` fetched from
    MLflow; never plans. Output: OUT_DIR/train, or a new out/<plan_id>/train-<time> without
    ``out_dir``."""
    if (plan_path is None) == (plan_id is None):
        raise InputError("train_flow needs a plan:", [Problem("plan_path / plan_id", "give exactly one")])
    if plan_id is not None:
        check_plan_id(plan_id)  # it names the output directory
    dirs = RunDirs.of(out_dir, work_dir)

    with started(tracking, work_dir) as start, dirs.locked(training.node_rank, training.nnodes):
        if plan_path is None:
            assert plan_id is not None
            train_dir = dirs.train_dir(plan_id)
            plan_path = fetch_plan_task(start.tracking, plan_id, str(Path(train_dir, PLAN_SUBDIR)))
        else:
            plan_id = read_plan(plan_path).plan_id
            train_dir = dirs.train_dir(plan_id)
        trained = train_with_retries(plan_id, plan_path, train_dir, training, train_retries,
                                     train_retry_delay_s, start.tracking)
        dirs.mark_latest(train_dir)
        logged = log_training(start.tracking, trained) if training.node_rank == 0 else None
    return TrainOutcome(trained.plan_id, plan_path, trained, logged)
