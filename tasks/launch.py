"""Launch the training job with torchrun: one process per rank, NCCL on cuda, gloo on cpu.

torchrun's own output (its agent, and whatever a rank prints before its log file is open) goes to
OUT/logs/torchrun-node<K>.log; each rank logs to OUT/logs/rank-<RANK>.log (``rec.train.rank_log``).
The progress lines of the node's first rank are passed on to ``rec.progress``; with ``--verbose``
(``SHARDFLOW_VERBOSE=1``) the rest is shown too. When torchrun fails, ``failure_cause`` finds the
cause once, in one line, from the ranks' error files and torchrun's summary.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rec import progress
from rec.settings import to_flags
from rec.train.config import TrainConfig
from rec.train.rank_log import LOG_DIR, RANK_LOG, clear_errors, log_dir, read_errors

VERBOSE_ENV = "SHARDFLOW_VERBOSE"  # "1" (``--verbose``): torchrun's output on the terminal as well
NODE_LOG = "torchrun-node{node}.log"
LAUNCH_HEADER = "== torchrun started"  # one line per launch: the node log is appended to
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_FAILURE_WORDS = re.compile(r"(?i)error|exception|killed|out of memory|abort|fault|terminat")
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Timeout)\b.*?: \S")


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
    return [*cmd, "-m", "rec.train.job", "--plan", launch.plan_path, "--out", launch.out_dir,
            *to_flags(launch.job)]


def job_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Lets NCCL free all-to-all buffers without recordStream: less memory, no stalls.
    env.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"  # progress lines reach the launcher as they are written
    # The job runs `-m rec.train.job`: make the project importable however it was installed.
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def node_log(launch: Launch) -> Path:
    return log_dir(launch.out_dir) / NODE_LOG.format(node=launch.node_rank)


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


def run_training(launch: Launch, env: dict[str, str] | None = None) -> int:
    """Run torchrun to completion on this node; its exit code (non-zero: a rank failed for good).
    Its output goes to the node's log, progress lines to ``rec.progress``, and with ``verbose()``
    everything to stderr as well."""
    echo = verbose()
    log_dir(launch.out_dir).mkdir(parents=True, exist_ok=True)
    clear_errors(launch.out_dir)
    with open(node_log(launch), "a") as sink:
        sink.write(f"{LAUNCH_HEADER} {time.strftime('%Y-%m-%d %H:%M:%S')} ==\n")
        sink.flush()
        proc = subprocess.Popen(torchrun_command(launch), env=job_environment(env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                update = progress.from_line(line.rstrip("\n"))
                if update is not None:
                    progress.update(**update)
                    continue
                sink.write(line)
                sink.flush()
                if echo:
                    sys.stderr.write(line)
        except BaseException:  # Ctrl-C, a cancelled Prefect task: no ranks left behind
            proc.terminate()
            proc.wait()
            raise
        return proc.wait()


@dataclass(frozen=True)
class Cause:
    text: str  # one line, for a message, an MLflow tag
    deterministic: bool  # the same failure on every retry


def failure_cause(launch: Launch, exit_code: int) -> Cause:
    """Why torchrun failed, in one line. A rank that died without a Python error (a crash, out of
    memory, killed) and not by torchrun's own SIGTERM is the cause; else the earliest error a rank
    reported (the other ranks mostly fail because of it: a peer went away); else torchrun's own
    last error line."""
    errors = read_errors(launch.out_dir)
    lines = node_log(launch).read_text(errors="replace").splitlines() if node_log(launch).exists() else []
    starts = [i for i, line in enumerate(lines) if line.startswith(LAUNCH_HEADER)]
    lines = lines[starts[-1] + 1:] if starts else lines  # this launch's lines only
    reported = {e.rank for e in errors}
    silent = [(r, c) for r, c in _failures(lines) if r not in reported and c != -signal.SIGTERM]
    followed = f" (then {len(errors)} more rank{'s' if len(errors) > 1 else ''} failed)" if errors else ""
    if silent:
        rank, code = silent[0]
        last = _last_line(log_dir(launch.out_dir) / RANK_LOG.format(rank=rank))
        return Cause(f"rank {rank} exited with {_exit(code)} without a Python error"
                     + (f"; its log ends: {last}" if last else "") + followed, False)
    if errors:
        first = errors[0]
        same = [e.rank for e in errors if e.cause == first.cause]
        others = len(errors) - len(same)
        text = f"{_ranks(same)}: {first.cause}" + (f" (then {others} more rank{'s' if others > 1 else ''} "
                                                   "failed)" if others else "")
        return Cause(text, first.deterministic)
    error = next((line.strip() for line in reversed(lines) if _ERROR_LINE.match(line.strip())), None)
    return Cause(error or f"torchrun exited with code {exit_code} (see {LOG_DIR}/)", False)


def _failures(lines: list[str]) -> list[tuple[int, int]]:
    """(rank, exit code) of every failed rank in torchrun's summary, its root cause first."""
    found: list[tuple[int, int]] = []
    root = next((i for i, line in enumerate(lines) if "Root Cause" in line), len(lines))
    for block in (lines[root:], lines[:root]):
        rank = None
        for line in block:
            if m := _SUMMARY_RANK.match(line):
                rank = int(m.group(1))
            elif rank is not None and (m := _SUMMARY_EXIT.match(line)):
                if all(r != rank for r, _ in found):
                    found.append((rank, int(m.group(1))))
                rank = None
    return found


def _exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def _last_line(path: Path) -> str:
    """The rank log's last line that reads like a failure (empty if none does)."""
    if not path.exists():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    last = next((line for line in reversed(lines) if line and not line.startswith("== rank")), "")
    return last[:200] if _FAILURE_WORDS.search(last) else ""


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))
