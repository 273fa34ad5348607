"""Launch the training job with torchrun: one process per rank, NCCL on cuda, gloo on cpu."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rec.errors import InputError, Problem
from rec.plan import Plan


@dataclass(frozen=True)
class Launch:
    """How to start the job on this node; ``job_args`` go to ``rec.train.job`` unchanged."""

    plan_path: str
    out_dir: str
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT; required for more than one node
    rdzv_id: str = "shardflow"
    max_restarts: int = 0
    job_args: tuple[str, ...] = field(default_factory=tuple)


def check_launch(plan: Plan, launch: Launch) -> None:
    """World size and rendezvous problems are the user's to fix: InputError before launching."""
    problems = []
    world = launch.nnodes * launch.nproc_per_node
    planned = int(plan.topology["world_size"])
    if world != planned:
        problems.append(Problem(
            "world size", f"--nnodes {launch.nnodes} x --nproc-per-node {launch.nproc_per_node} = "
                          f"{world} processes, but plan {plan.plan_id} is for {planned} ranks"))
    if launch.nnodes > 1 and not launch.rdzv_endpoint:
        problems.append(Problem("--rdzv-endpoint", "is required with --nnodes > 1 (HOST:PORT of node 0)"))
    if problems:
        raise InputError("Cannot launch training with this plan:", problems)


def job_flags(iterations: int, warmup: int, pipeline: str, model: str, batch_size: int | None = None,
              data: str | None = None, checkpoint_dir: str | None = None, checkpoint_every: int = 0,
              resume: bool = False) -> tuple[str, ...]:
    """The ``rec.train.job`` flags for these settings (defaults left out)."""
    flags = ["--iterations", str(iterations), "--warmup", str(warmup), "--pipeline", pipeline,
             "--model", model]
    if batch_size:
        flags += ["--batch-size", str(batch_size)]
    if data:
        flags += ["--data", data]
    if checkpoint_dir:
        flags += ["--checkpoint-dir", checkpoint_dir, "--checkpoint-every", str(checkpoint_every)]
    if resume:
        flags.append("--resume")
    return tuple(flags)


def plan_launch(plan: Plan, plan_path: str, out_dir: str, job_args: tuple[str, ...],
                nproc_per_node: int | None = None, nnodes: int = 1, node_rank: int = 0,
                rdzv_endpoint: str | None = None, max_restarts: int = 0) -> Launch:
    """The checked launch of ``plan`` (one process per local rank unless told otherwise)."""
    launch = Launch(plan_path=plan_path, out_dir=out_dir,
                    nproc_per_node=nproc_per_node or int(plan.topology["local_world_size"]),
                    nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                    rdzv_id=plan.plan_id, max_restarts=max_restarts, job_args=job_args)
    check_launch(plan, launch)
    return launch


def torchrun_command(launch: Launch) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run",
           f"--nproc-per-node={launch.nproc_per_node}", f"--max-restarts={launch.max_restarts}"]
    if launch.nnodes == 1 and not launch.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={launch.nnodes}", f"--node-rank={launch.node_rank}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={launch.rdzv_endpoint}",
                f"--rdzv-id={launch.rdzv_id}"]
    return cmd + ["-m", "rec.train.job", "--plan", launch.plan_path, "--out", launch.out_dir,
                  *launch.job_args]


def job_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Lets NCCL free all-to-all buffers without recordStream: less memory, no stalls.
    env.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    # The job runs `-m rec.train.job`: make the project importable however it was installed.
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def run_training(launch: Launch, env: dict[str, str] | None = None, quiet: bool = False) -> int:
    """Run torchrun to completion on this node; its exit code (non-zero: a rank failed for good)."""
    Path(launch.out_dir).mkdir(parents=True, exist_ok=True)
    log = Path(launch.out_dir) / f"torchrun_node{launch.node_rank}.log"
    with open(log, "w") as sink:
        proc = subprocess.run(torchrun_command(launch), env=job_environment(env),
                              stdout=sink if quiet else None, stderr=subprocess.STDOUT if quiet else None)
    return proc.returncode
