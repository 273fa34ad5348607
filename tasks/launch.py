"""Launch the training job (or the measuring job) with torchrun: one process per rank, NCCL on
cuda, gloo on cpu.

torchrun's own output (its agent, and whatever a rank prints before its log file is open) goes to
OUT/logs/torchrun-node<K>.log; each rank logs to OUT/logs/rank-<RANK>.log (``rec.train.rank_log``).
The progress lines of the node's first rank are passed on to ``rec.progress``; with ``--verbose``
(``SHARDFLOW_VERBOSE=1``) the rest is shown too. When torchrun fails, ``failure_cause`` finds the
cause once, in one line, from the ranks' error files (or the records they sent) and torchrun's
summary. torchrun and its ranks never outlive the launcher (``run_training``, ``rec.train.lifetime``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rec import progress
from rec.disk_full import CheckpointWriteFailed, DiskFull, is_disk_full
from rec.errors import ERROR_LINE, InputError
from rec.settings import to_flags
from rec.stop_signals import Stopped as Stopped  # re-exported
from rec.stop_signals import signals_stop
from rec.train.config import NODE_RANK_ENV, TrainConfig
from rec.train.launcher import FORKSERVER_FLAG
from rec.train.lifetime import LAUNCHER_MODULE, parent_death_signal
from rec.train.measure_config import MeasureConfig
from rec.train.rank_log import LOG_DIR, RANK_LOG, RankError, clear_errors, error_from_line, log_dir, read_errors

VERBOSE_ENV = "SHARDFLOW_VERBOSE"  # "1" (``--verbose``): torchrun's output on the terminal as well
NODE_LOG = "torchrun-node{node}.log"
LAUNCH_HEADER = "== torchrun started"  # one line per launch: the node log is appended to
STOP_GRACE_S = 10.0  # torchrun's time to stop its ranks before it is killed
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_FAILURE_WORDS = re.compile(r"(?i)error|exception|killed|out of memory|abort|fault|terminat")
# A rank's collective that lost its peer (gloo's words; NCCL's): the other side went away, not this rank.
_PEER_LOST = re.compile(r"Connection (?:reset|closed) by peer|remote process exited|Broken pipe")
_BOILERPLATE = re.compile(r"\.? ?This is typically caused by .*$")  # gloo's advice, ending "GLHF!"


TRAIN_JOB = "rec.train.job"
MEASURE_JOB = "rec.train.measure_job"
EVAL_JOB = "rec.train.eval_job"
# The rendezvous of each job, one id per kind of job: nodes started with different plans (or settings)
# meet and the job's agreement check names the difference (rec.train.agreement), where an id of the
# plan's had them wait for each other until the join timeout.
TRAIN_RDZV_ID = "shardflow-train"
EVAL_RDZV_ID = "shardflow-eval"
MEASURE_RDZV_ID = "shardflow-measure"
JOIN_TIMEOUT_S = 600  # torchrun's default: how long the nodes wait for each other at the rendezvous
TORCHRUN_ENV_PREFIX = "PET_"  # torchrun's environment defaults of its flags


@dataclass(frozen=True)
class Launch:
    """How to start the job on this node; ``job`` goes to the job's ``module`` as its flags."""

    plan_path: str
    out_dir: str
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT; required for more than one node
    rdzv_id: str = TRAIN_RDZV_ID
    join_timeout_s: int = JOIN_TIMEOUT_S  # at the start and after each restart
    max_restarts: int = 0
    job: TrainConfig | MeasureConfig = field(default_factory=TrainConfig)
    module: str = TRAIN_JOB  # the job torchrun starts (``python -m``): training, or measuring
    more_plans: tuple[str, ...] = ()  # plans after ``plan_path``, for a job that takes several (measuring)
    more_flags: tuple[str, ...] = ()  # the job's own flags besides ``job``'s (evaluation: --checkpoint)


def torchrun_command(launch: Launch) -> list[str]:
    # --log-dir /dev/null: torchrun keeps no per-rank directories (a /tmp/torchelastic_* per run);
    # each rank logs to OUT/logs itself, and torchrun's own output comes to the launcher.
    # --start-method forkserver: the ranks are forked from a process that imported the job once.
    cmd = [sys.executable, "-m", LAUNCHER_MODULE, f"--nproc-per-node={launch.nproc_per_node}",
           f"--max-restarts={launch.max_restarts}", f"--log-dir={os.devnull}", FORKSERVER_FLAG]
    if launch.nnodes == 1 and not launch.rdzv_endpoint:
        cmd += ["--standalone", "--nnodes=1"]
    else:
        cmd += [f"--nnodes={launch.nnodes}", f"--node-rank={launch.node_rank}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={launch.rdzv_endpoint}",
                # read_timeout: how long a node waits for node 0's rendezvous store to answer (torch's 60 s)
                f"--rdzv-id={launch.rdzv_id}",
                f"--rdzv-conf=join_timeout={launch.join_timeout_s},read_timeout={launch.join_timeout_s}"]
    # Paths as --out=PATH, plans absolute: a path starting with "-" (./-plan is "-plan") is no flag there.
    plans = [os.path.abspath(p) for p in (launch.plan_path, *launch.more_plans)]
    return [*cmd, "-m", launch.module, "--plan", *plans, f"--out={launch.out_dir}", *to_flags(launch.job),
            *launch.more_flags]


def job_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    # torchrun takes PET_<FLAG> as the default of each flag: an outer launcher's (Kubeflow's training
    # operator sets PET_NNODES in every pod) would change the launch shardflow asks for.
    env = {k: v for k, v in os.environ.items() if not k.startswith(TORCHRUN_ENV_PREFIX)}
    # Warnings made errors (PYTHONWARNINGS=error) stopped the forkserver at a library's import-time
    # DeprecationWarning (fbgemm-gpu's): every launch failed as "EOFError". The ranks log warnings.
    env.pop("PYTHONWARNINGS", None)
    # Lets NCCL free all-to-all buffers without recordStream: less memory, no stalls.
    env.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    # The forkserver imports fbgemm-gpu, which asks torch.cuda.is_available() on import: NVML's
    # answer leaves CUDA uninitialized there, so that the ranks forked from it can use CUDA.
    env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
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


@dataclass(frozen=True)
class Finished:
    """How torchrun ended on this node: its exit code, and the failures ranks sent on the pipe."""

    code: int
    sent: tuple[RankError, ...] = ()


def run_training(launch: Launch, env: dict[str, str] | None = None) -> Finished:
    """Run torchrun to completion on this node. Its output goes to the node's log, progress lines
    to ``rec.progress``, and with ``verbose()`` everything to stderr as well.

    torchrun runs in its own session and dies with the launcher (``rec.train.lifetime``). SIGTERM,
    SIGINT or SIGHUP to the launcher (in the main thread), an exception or a cancelled Prefect
    task stop torchrun, which stops its ranks, before the launcher goes on: ``Stopped`` for a
    signal."""
    echo = verbose()
    log_dir(launch.out_dir).mkdir(parents=True, exist_ok=True)
    clear_errors(launch.out_dir)
    sent: list[RankError] = []
    with NodeLog(node_log(launch)) as sink, signals_stop():
        sink.write(f"{LAUNCH_HEADER} {time.strftime('%Y-%m-%d %H:%M:%S')} ==\n")
        env = {**(env or {}), NODE_RANK_ENV: str(launch.node_rank)}
        proc = subprocess.Popen(torchrun_command(launch), env=job_environment(env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                                start_new_session=True, preexec_fn=parent_death_signal())
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                update = progress.from_line(line.rstrip("\n"))
                if update is not None:
                    progress.update(**update)
                    continue
                error = error_from_line(line)
                if error is not None:
                    sent.append(error)
                    continue
                sink.write(line)
                if echo:
                    sys.stderr.write(line)
            code = proc.wait()
        except BaseException as e:  # a signal, Ctrl-C, a cancelled Prefect task: no ranks left behind
            stop(proc)
            if isinstance(e, Stopped):
                e.out_dir = launch.out_dir
            raise
        finally:
            proc.stdout.close()
    return Finished(code, tuple(sent))


def stop(proc: subprocess.Popen[str]) -> None:
    """Stop torchrun: SIGTERM to its process group (torchrun then stops its ranks, which run in
    sessions of their own, and waits for them); SIGKILL after ``STOP_GRACE_S``, or at once on a
    second interrupt (the ranks then get their parent-death signal)."""
    if proc.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class NodeLog:
    """The node's torchrun log, appended to; a full disk ends the log (one line on stderr says so)
    instead of the training: the cause of a failure reaches the launcher on the pipe as well."""

    def __init__(self, path: Path):
        self.path = path
        self._file: TextIO | None = None

    def __enter__(self) -> NodeLog:
        try:
            self._file = open(self.path, "a")
        except OSError as e:
            self._lost(e)
        return self

    def write(self, line: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as e:
            self._lost(e)

    def _lost(self, error: OSError) -> None:
        if not is_disk_full(error):
            raise error
        print(f"shardflow: {DiskFull(self.path, error)}; torchrun's output is not logged", file=sys.stderr)
        if self._file is not None:
            with suppress(OSError):
                self._file.close()
        self._file = None

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            with suppress(OSError):
                self._file.close()


@dataclass(frozen=True)
class Cause:
    text: str  # one line, for a message, an MLflow tag
    deterministic: bool  # the same failure on every retry
    disk_full: bool = False  # an output could not be written: a retry seconds later fills the same disk
    problems: tuple[str, ...] = ()  # bad input of several problems, or of one too long for ``text``: each, one line


def failure_cause(launch: Launch, finished: Finished) -> Cause:
    """Why torchrun failed, in one line. A rank that died without a Python error (a crash, out of
    memory, killed) and not by torchrun's own SIGTERM is the cause; else the earliest error a rank
    reported (the other ranks mostly fail because of it: a peer went away), an output that could
    not be written (a full disk) before any other; else torchrun's own last error line."""
    exit_code = finished.code
    errors = read_errors(launch.out_dir, finished.sent)
    lines = node_log(launch).read_text(errors="replace").splitlines() if node_log(launch).exists() else []
    starts = [i for i, line in enumerate(lines) if line.startswith(LAUNCH_HEADER)]
    lines = lines[starts[-1] + 1:] if starts else lines  # this launch's lines only
    # torchrun's own words say only the class
    met_no_more = any("RendezvousTimeoutError" in line for line in lines)
    reported = {e.rank for e in errors}
    silent = [(r, c) for r, c in _failures(lines) if r not in reported and c != -signal.SIGTERM]
    followed = f" (then {len(errors)} more rank{'s' if len(errors) > 1 else ''} failed)" if errors else ""
    if silent:
        rank, code = silent[0]
        last = _last_line(log_dir(launch.out_dir) / RANK_LOG.format(rank=rank))
        return Cause(f"rank {rank} exited with {_exit(code)} without a Python error"
                     + (f"; its log ends: {last}" if last else "") + followed, False)
    if errors:
        # an output that could not be written (a full disk, a failing one) explains the rest
        first = next((e for e in errors if e.disk_full), None) or next(
            (e for e in errors if e.cause.startswith(f"{CheckpointWriteFailed.__name__}:")), errors[0])
        same = sorted(e.rank for e in errors if e.cause == first.cause)
        # other ranks' own bad input (each rank reads its share of the data): named too, not one run at a time
        bad_input = [e for e in errors if e.rank not in same and _is_bad_input(e)] if _is_bad_input(first) else []
        problems = first.problems + tuple(f"rank {e.rank}: {line}" for e in bad_input
                                          for line in (e.problems or (e.cause.removeprefix(_INPUT_ERROR),)))
        others = len(errors) - len(same) - len(bad_input)
        cause = first.cause + (f" (and {_ranks(sorted(e.rank for e in bad_input))}'s own bad input, below)"
                               if bad_input else "")
        if launch.nnodes > 1 and _PEER_LOST.search(cause):  # it named the surviving node's rank only
            cause = (f"lost the connection to a rank of another node, which stopped or crashed (see that node's "
                     f"output): {_BOILERPLATE.sub('', cause)}")
        text = f"{_ranks(same)}: {cause}" + (f" (then {others} more rank{'s' if others > 1 else ''} "
                                             "failed)" if others else "")
        if met_no_more:  # torchrun restarted the ranks (--max-restarts), and a node never came back
            text += (f"; restarting, the {launch.nnodes} nodes did not meet again at {launch.rdzv_endpoint} "
                     f"within {launch.join_timeout_s} s (--join-timeout)")
        return Cause(text, first.deterministic, first.disk_full, problems)
    if any("RendezvousConnectionError" in line for line in lines):
        return Cause(f"nothing answered at {launch.rdzv_endpoint} within {launch.join_timeout_s} s (--join-timeout): "
                     "start node 0 (--node-rank 0), whose machine hosts the rendezvous there, or give every node "
                     "its address", False)
    if met_no_more:
        return Cause(f"the {launch.nnodes} nodes did not all meet at {launch.rdzv_endpoint or 'the rendezvous'} "
                     f"within {launch.join_timeout_s} s (--join-timeout): start every node with the same --nnodes "
                     "and --rdzv-endpoint, each with its own --node-rank", False)
    error = next((line.strip() for line in reversed(lines) if ERROR_LINE.match(line.strip())), None)
    return Cause(error or f"torchrun exited with code {exit_code} (see {LOG_DIR}/)", False)


_INPUT_ERROR = f"{InputError.__name__}: "  # how a rank's cause names bad input (``rank_log.one_line``)


def _is_bad_input(error: RankError) -> bool:
    return error.deterministic and error.cause.startswith(_INPUT_ERROR)


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
