"""Launch the training job with torchrun: one process per rank, NCCL on cuda, gloo on cpu."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rec.settings import to_flags
from rec.train.config import TrainConfig


@dataclass(frozen=True)
class Launch:
    """How to start the job on this node; ``job`` goes to ``rec.train.job`` as its flags."""

    plan_path: str
    out_dir: str
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT; required for more than one node
    rdzv_id: str = "shardflow"
    max_restarts: int = 0
    job: TrainConfig = field(default_factory=TrainConfig)


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
                  *to_flags(launch.job)]


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


def torchrun_log(launch: Launch) -> Path:
    return Path(launch.out_dir) / f"torchrun_node{launch.node_rank}.log"


def run_training(launch: Launch, env: dict[str, str] | None = None, quiet: bool = False) -> int:
    """Run torchrun to completion on this node; its exit code (non-zero: a rank failed for good).
    ``quiet``: its output goes to the node's log file instead of the terminal."""
    Path(launch.out_dir).mkdir(parents=True, exist_ok=True)
    with open(torchrun_log(launch), "w") as sink:
        proc = subprocess.run(torchrun_command(launch), env=job_environment(env),
                              stdout=sink if quiet else None, stderr=subprocess.STDOUT if quiet else None)
    return proc.returncode
