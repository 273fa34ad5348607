"""Step 4, the training job: torchrun on a plan artifact. It never plans: the plan is its input.

``train`` checks the plan (sound, unedited, for this many processes) and the settings before any
process starts, then runs torchrun on this node to completion. The CLI calls it directly; the
Prefect task in ``tasks.steps`` wraps it with retries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rec.errors import InputError, Problem
from rec.plan import check_plan, read_plan
from rec.settings import check, knob
from rec.train.config import FAIL_AT_ENV, TrainConfig
from rec.train.metrics import METRICS_FILE
from tasks.launch import Launch, run_training, torchrun_log

MAX_PROCESSES = 1 << 16


@dataclass(frozen=True)
class TrainSettings:
    """The job's own knobs (``job``) and where its processes run."""

    job: TrainConfig = field(default_factory=TrainConfig)
    nproc_per_node: int | None = field(default=None, metadata=knob(
        "processes on this node; none: the plan's local_world_size", minimum=1, maximum=MAX_PROCESSES))
    nnodes: int = field(default=1, metadata=knob("nodes taking part", minimum=1, maximum=MAX_PROCESSES))
    node_rank: int = field(default=0, metadata=knob("this node's rank among the nodes", minimum=0))
    rdzv_endpoint: str | None = field(default=None, metadata=knob(
        "HOST:PORT of node 0's rendezvous; required with more than one node", metavar="HOST:PORT"))
    max_restarts: int = field(default=0, metadata=knob(
        "torchrun restarts after a rank dies; training resumes from the last checkpoint",
        minimum=0, maximum=1000))

    def problems(self) -> list[Problem]:
        out = self.job.problems()
        if self.node_rank >= self.nnodes:
            out.append(Problem("--node-rank", f"{self.node_rank} is not below --nnodes {self.nnodes}"))
        if self.nnodes > 1 and not self.rdzv_endpoint:
            out.append(Problem("--rdzv-endpoint", "is required with --nnodes > 1 (HOST:PORT of node 0)"))
        return out


@dataclass(frozen=True)
class Trained:
    """A finished training: what the job reported (train_metrics.json) and how it got there."""

    plan_id: str
    out_dir: str
    metrics: dict
    settings: TrainSettings
    nproc_per_node: int
    attempts: int  # attempts it took, 1 when the first one succeeded
    started_ms: int


class TrainingFailed(RuntimeError):
    """torchrun exited non-zero: a rank failed for good (after torchrun's own restarts)."""


def prepare(plan_path: str, out_dir: str, settings: TrainSettings) -> tuple[str, Launch]:
    """The plan's id and the checked torchrun launch; InputError for anything that would fail
    the job for certain (bad settings, an unsound or edited plan, a world size that does not fit)."""
    check(settings, "Cannot train with these settings:")
    plan = read_plan(plan_path)
    check_plan(plan)
    path = Path(plan_path)
    launch = Launch(plan_path=str(path / "plan.json" if path.is_dir() else path), out_dir=out_dir,
                    nproc_per_node=settings.nproc_per_node or int(plan.topology["local_world_size"]),
                    nnodes=settings.nnodes, node_rank=settings.node_rank,
                    rdzv_endpoint=settings.rdzv_endpoint, rdzv_id=plan.plan_id,
                    max_restarts=settings.max_restarts, job=settings.job)
    world = launch.nnodes * launch.nproc_per_node
    if world != plan.world_size:
        raise InputError("Cannot launch training with this plan:", [Problem(
            "world size", f"--nnodes {launch.nnodes} x --nproc-per-node {launch.nproc_per_node} = "
                          f"{world} processes, but plan {plan.plan_id} is for {plan.world_size} ranks")])
    return plan.plan_id, launch


def train(plan_path: str, out_dir: str, settings: TrainSettings = TrainSettings(), attempt: int = 1,
          quiet: bool = False) -> Trained:
    """Train with the plan at ``plan_path``; TrainingFailed if a rank failed for good."""
    from tasks.records import now_ms

    started = now_ms()
    plan_id, launch = prepare(plan_path, out_dir, settings)
    # Fault injection means "the first attempt", as inside the job; but a retry is a new torchrun
    # whose restart count starts at 0 again, so retries switch it off explicitly.
    env = {FAIL_AT_ENV: ""} if attempt > 1 else None
    code = run_training(launch, env=env, quiet=quiet)
    if code != 0:
        log = torchrun_log(launch)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
        raise TrainingFailed(f"torchrun exited {code} (attempt {attempt}); log {log}:\n{tail}")
    metrics_file = Path(out_dir) / METRICS_FILE
    metrics = json.loads(metrics_file.read_text()) if launch.node_rank == 0 else {}
    return Trained(plan_id, out_dir, metrics, settings, launch.nproc_per_node, attempt, started)
