"""Step 4, the training job: torchrun on the plan artifact, retried by Prefect with backoff.

A retry starts torchrun again with the same plan.json; it never replans (the plan is an input
of this task, not something it computes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run
from prefect.tasks import exponential_backoff

from rec.plan import read_plan
from rec.train.metrics import METRICS_FILE
from tasks.launch import Launch, job_flags, plan_launch, run_training
from tasks.records import now_ms
from tasks.retry import unless_input_error

LOG_TAIL_LINES = 15
FAIL_AT_ENV = "SHARDFLOW_FAIL_AT_ITERATION"  # rec.train.job.FAIL_AT_ENV; that module imports torch


@dataclass(frozen=True)
class TrainSettings:
    """The training job's knobs (``rec.train.job`` flags) and where its processes run."""

    iterations: int = 100
    warmup: int = 10
    batch_size: int | None = None  # per rank; None: the plan topology's
    nproc_per_node: int | None = None  # None: the plan's local_world_size
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT of node 0, for more than one node
    max_restarts: int = 0  # torchrun's own restarts, before Prefect's retries
    pipeline: str = "sparse_dist"  # sparse_dist | naive
    model: str = "auto"  # auto | dlrm | dlrm_dcn | concat
    data: str | None = None  # Parquet training data; None: synthetic

    def job_args(self) -> tuple[str, ...]:
        return job_flags(self.iterations, self.warmup, self.pipeline, self.model,
                         self.batch_size, self.data)


@dataclass(frozen=True)
class Trained:
    """A finished training: what the job reported (train_metrics.json) and how it got there."""

    plan_id: str
    out_dir: str
    metrics: dict
    settings: TrainSettings
    nproc_per_node: int
    attempts: int  # Prefect attempts, 1 when the first one succeeded
    started_ms: int


class TrainingFailed(RuntimeError):
    """torchrun exited non-zero: a rank failed for good (after torchrun's own restarts)."""


def launch_for(plan_path: str, settings: TrainSettings, out_dir: str) -> tuple[str, Launch]:
    """The plan's id and the torchrun launch for it; InputError if the world size does not match."""
    plan = read_plan(plan_path)
    launch = plan_launch(plan, plan_path, out_dir, settings.job_args(), settings.nproc_per_node,
                         settings.nnodes, settings.node_rank, settings.rdzv_endpoint,
                         settings.max_restarts)
    return plan.plan_id, launch


@task(name="launch-training", cache_policy=NO_CACHE, retries=2,
      retry_delay_seconds=exponential_backoff(backoff_factor=10), retry_condition_fn=unless_input_error)
def launch_training(plan_path: str, settings: TrainSettings, out_dir: str) -> Trained:
    """Run torchrun on this node to completion; TrainingFailed (retried) if a rank failed."""
    started, attempt = now_ms(), task_run.run_count
    plan_id, launch = launch_for(plan_path, settings, out_dir)
    # Fault injection means "the first attempt", as inside the job; but a Prefect retry is a new
    # torchrun whose restart count starts at 0 again, so retries switch it off explicitly.
    env = {FAIL_AT_ENV: ""} if attempt > 1 else None
    code = run_training(launch, env=env, quiet=True)
    log = Path(out_dir) / f"torchrun_node{launch.node_rank}.log"
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        raise TrainingFailed(f"torchrun exited {code} (attempt {attempt}); log {log}:\n{tail}")
    metrics_file = Path(out_dir) / METRICS_FILE
    metrics = json.loads(metrics_file.read_text()) if launch.node_rank == 0 else {}
    return Trained(plan_id, out_dir, metrics, settings, launch.nproc_per_node, attempt, started)
