"""Step 4, the training job: torchrun on a plan artifact. It never plans: the plan is its input.

``train`` runs ``preflight`` first: in seconds, before any process starts, everything that would
fail the job for certain (bad settings, an unsound or edited plan, a world size that does not fit,
a cuda plan on a machine without CUDA or NCCL, a bad rendezvous endpoint, missing data) is one
InputError. Then torchrun runs on this node to completion; a failure is a ``TrainingFailed`` with
its cause in one line. The CLI calls ``train`` directly; the Prefect task in ``tasks.steps`` wraps
it with retries, which skip InputErrors and failures that would repeat.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rec import progress
from rec.analysis import check_plan
from rec.errors import InputError, Problem, printable
from rec.plan import Plan, plan_file, read_plan
from rec.settings import check, knob, settings_problems
from rec.spec.types import Spec
from rec.topology.types import Topology
from rec.train.config import FAIL_AT_ENV, PLAN_ID_FLAG, TrainConfig
from rec.train.metrics import METRICS_FILE, TrainMetrics, read_metrics
from rec.train.ownership import Run, control_character
from rec.train.rank_log import log_dir
from rec.units import counted
from tasks.launch import JOIN_TIMEOUT_S, TRAIN_RDZV_ID, Launch, failure_cause, run_training

MAX_PROCESSES = 1 << 16
# Prefect's retries of a failed training (``train_task``; flow parameter and --train-retries), the
# first after TRAIN_RETRY_DELAY_S seconds, then with exponential backoff.
TRAIN_RETRIES = 2
TRAIN_RETRY_DELAY_S = 10.0


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
    join_timeout: int = field(default=JOIN_TIMEOUT_S, metadata=knob(
        "seconds the nodes wait for each other at the rendezvous, at the start and after a restart "
        "(torchrun's join_timeout)", minimum=1, maximum=7 * 24 * 3600, metavar="SECONDS"))

    def problems(self) -> list[Problem]:
        out = self.job.problems()
        if self.node_rank >= self.nnodes:
            out.append(Problem("--node-rank", f"{self.node_rank} is not below --nnodes {self.nnodes}"))
        if self.nnodes > 1 and not self.rdzv_endpoint:
            out.append(Problem("--rdzv-endpoint", "is required with --nnodes > 1 (HOST:PORT of node 0)"))
        return out

    def processes(self, topology: Topology) -> int:
        """The processes this node starts: ``--nproc-per-node``, else the plan's local_world_size."""
        return self.nproc_per_node or topology.local_world_size


@dataclass(frozen=True)
class Trained:
    """A finished training: what the job reported (train_metrics.json) and how it got there."""

    plan_id: str
    out_dir: str
    metrics: TrainMetrics | None  # None on a node other than 0 (node 0 reads train_metrics.json)
    settings: TrainSettings
    nproc_per_node: int
    attempts: int  # attempts it took, 1 when the first one succeeded
    started_ms: int
    plan_path: str = ""  # the plan.json it trained with


class TrainingFailed(RuntimeError):
    """torchrun exited non-zero: a rank failed for good (after torchrun's own restarts).
    ``cause`` is one line; ``deterministic``: a retry would fail the same way (bad input); ``disk_full``:
    an output could not be written, which a retry seconds later would not change either (exit 1, not 2);
    ``problems``: bad input a rank found, every problem one line, where the one-line ``cause`` could not
    hold them (it names the first)."""

    def __init__(self, cause: str, deterministic: bool, logs: str, attempt: int, disk_full: bool = False,
                 problems: tuple[str, ...] = ()):
        super().__init__(f"{cause} (attempt {attempt}; logs in {logs})" + listed(problems))
        self.cause, self.deterministic, self.logs, self.attempt = cause, deterministic, logs, attempt
        self.disk_full, self.problems = disk_full, tuple(problems)

    def __reduce__(self) -> tuple[Any, ...]:  # Prefect may copy the exception of a failed state
        return type(self), (self.cause, self.deterministic, self.logs, self.attempt, self.disk_full, self.problems)


def listed(problems: Sequence[str]) -> str:
    """Problems under the line that names the first: each on its own line, as an InputError shows them."""
    return "".join(f"\n  - {p}" for p in problems)


def preflight(settings: TrainSettings, topology: Topology, spec: Spec | None = None,
              notes: list[str] | None = None, plan: Plan | None = None) -> int:
    """Check, before any process starts, what would fail the job for certain on this machine;
    InputError naming every problem. ``topology``: the plan's; ``--data`` and ``--eval-data``
    (their files, columns and a sample of rows) are checked against ``spec``'s tables, and so is the
    model of ``--model TARGET``, its tables' optimizers against the kernels of ``plan`` where there is
    one (``run`` checks before planning). Returns the processes to start on this node; what the launcher says
    without refusing (the sample's unscaled dense values, a user model's uninitialized parameters)
    goes into ``notes``."""
    problems = settings_problems(settings)
    refused = {p.where for p in problems}  # settings the checks below would misread
    nproc = settings.processes(topology)
    world, planned = settings.nnodes * nproc, topology.world_size
    others: list[Problem] = []
    if world != planned and not refused & {"--nnodes", "--nproc-per-node"}:
        others.append(Problem("world size", f"--nnodes {settings.nnodes} x --nproc-per-node {nproc} = "
                                            f"{world} processes, but the plan is for {planned} ranks"))
    if nproc >= 1:
        others += _device_problems(topology.compute_device.value, nproc)
    if settings.rdzv_endpoint:
        others += _endpoint_problems(settings.rdzv_endpoint)
    said: list[str] = []
    if spec is not None and world >= 1 and "--dense-in-features" not in refused:
        found, said = _data_problems(settings.job, spec, world)
        others += found
    if settings.job.model_target and spec is not None:
        from rec.train.user_model import user_model_problems

        found, told = user_model_problems(settings.job.model_target, spec, plan)
        others += found
        said += told
    if notes is not None:
        notes += said
    if problems or others:
        title = ("Cannot train with these settings and this plan here:" if problems and others
                 else "Cannot train with these settings:" if problems else "Cannot train with this plan here:")
        raise InputError(title, problems + others)
    return nproc


def check_settings(settings: TrainSettings, plan_path: str | None = None) -> None:
    """InputError for bad settings, before anything is made; beside them it names what
    ``preflight`` finds with the plan at ``plan_path`` (the plan's own problems where it cannot
    be read), so that one message names every problem."""
    problems = settings_problems(settings)
    if not problems:
        return
    if plan_path is not None:
        try:
            plan = read_plan(plan_path)
        except InputError as e:
            raise InputError("Cannot train with these settings and this plan:", [*problems, *e.problems]) from None
        preflight(settings, plan.topology, plan.spec, plan=plan)
    check(settings, "Cannot train with these settings:")


def _data_problems(job: TrainConfig, spec: Spec, world: int) -> tuple[list[Problem], list[str]]:
    """What is wrong with ``--data`` and ``--eval-data`` for ``spec``'s model on ``world`` ranks
    (rec.data.schema), the note on ``--data``'s dense values and on labels of one class."""
    sources = [(what, path) for what, path in (("--data", job.data), ("--eval-data", job.eval_data))
               if path and not job.model_target]
    if not sources:
        return [], []
    from rec.data.layout import DataLayout
    from rec.data.schema import data_findings

    layout = DataLayout.of_spec(spec, job.dense_in_features)
    problems, notes = [], []
    for what, path in sources:
        found = data_findings(path, layout, job.ids, what, ranks=world if what == "--data" else 1)
        problems += found.problems
        notes += [note for note in (found.dense_note if what == "--data" else "", found.label_note) if note]
    return problems, notes


def check_resume_from(job: TrainConfig, plan: Plan, reading: ExitStack) -> Path:
    """The checkpoint ``--resume-from`` names exists, belongs to a plan the new one can start
    from, has an index shardflow reads safely, and leaves iterations to train; InputError otherwise.
    Returns its step directory, held until ``reading`` closes (its training, if it goes on, does not
    prune the step the ranks are to read: ``rec.train.held_step``)."""
    from rec.train.checkpoint import check_index
    from rec.train.held_step import held_checkpoint
    from rec.train.resume import RESUME_HINT, check_resume, resume_title, source_at, step_dir

    assert job.resume_from is not None
    held = reading.enter_context(held_checkpoint(job.resume_from, resume_title(job.resume_from), RESUME_HINT))
    source = source_at(job.resume_from, *held)
    check_resume(source, plan)
    check_index(step_dir(source.checkpoint_dir, source.step), source.plan.spec)
    _check_data_given(job, step_dir(source.checkpoint_dir, source.step))
    _check_dense_part(source.checkpoint_dir, plan, job, f"Cannot resume from {job.resume_from}:")
    if source.step >= job.iterations:
        raise InputError("Nothing left to train:", [Problem(
            "--iterations", f"{job.iterations} is not above the checkpoint's iteration {source.step}")])
    return step_dir(source.checkpoint_dir, source.step)


def check_own_checkpoint(job: TrainConfig, out_dir: str, run: Run | None = None, plan: Plan | None = None,
                         nodes: int = 1) -> str:
    """For ``--resume``: the newest checkpoint in the checkpoint directory, if there is one, has an
    index shardflow reads safely, of ``plan``'s tables; InputError otherwise (the ranks would refuse it too,
    later). Returns a line saying whose checkpoint the run continues when another run (``run``: this
    one) wrote it, or that there is none to continue."""
    from rec.train.ownership import another_runs
    from rec.train.resume import another_plans, checkpoint_dir, step_dir

    newest = _newest_checkpoint(job, out_dir)
    if newest is None:  # a retry of a training that stopped before its first checkpoint starts over
        directory = checkpoint_dir(job, out_dir)
        return f"resume    no complete checkpoint in {directory} (no LATEST): training from iteration 0"
    directory, step = newest
    _check_left_to_train(job, out_dir, directory, step, nodes)
    if plan is not None:
        problem = another_plans(directory, plan)
        if problem:
            raise InputError(f"Cannot resume from {directory}:", [problem])
    from rec.train.checkpoint import check_index  # imports torch: only for a checkpoint to read

    at = step_dir(directory, step)
    check_index(at, None if plan is None else plan.spec)
    _check_data_given(job, at)
    if plan is not None:
        _check_dense_part(directory, plan, job, f"Cannot resume from {directory}:")
    other = another_runs(at, run or Run.new(out_dir))
    return f"resume    continues the checkpoint of iteration {step} ({at}) that {other.describe()} wrote" \
        if other else ""


def _check_data_given(job: TrainConfig, step: Path) -> None:
    """InputError where a resume without ``--data`` would continue, on synthetic batches, the checkpoint
    ``step`` of a training on a dataset (the ranks refuse it too)."""
    from rec.train.feed import RESUME_WITHOUT_DATA, read_position, without_data

    if job.data is None and job.model_target is None:
        problem = without_data(read_position(step))
        if problem is not None:
            raise InputError(RESUME_WITHOUT_DATA, [problem])


def _check_left_to_train(job: TrainConfig, out_dir: str, directory: str, step: int, nodes: int) -> None:
    """InputError, before any rank starts, where the newest checkpoint (of iteration ``step``) leaves
    nothing to do: it is beyond ``--iterations``, or at it with the training's outputs written (a
    training stopped after its last checkpoint but before them is finished by the resume). The
    outputs are looked for on one node only: on several, node 0's ``--out`` alone may hold them, and
    a node refused alone would leave the others waiting at the rendezvous (the resume finishes the
    training again there)."""
    from rec.train.resume import beyond_iterations

    if step > job.iterations:
        raise beyond_iterations(directory, step, job.iterations)
    metrics = Path(out_dir) / METRICS_FILE
    if nodes == 1 and step == job.iterations and metrics.is_file() and _trained_to(out_dir) == step:
        raise InputError("Nothing left to train:", [Problem(
            str(metrics), f"the training already ran its {step} iterations (the newest checkpoint is of iteration "
                          f"{step}); --iterations above {step} trains on")])


def _trained_to(out_dir: str) -> int | None:
    """The iterations ``out_dir``'s train_metrics.json says its training ran; None where it cannot be
    read (the finishing resume writes it anew)."""
    try:
        return read_metrics(out_dir).iterations
    except InputError:
        return None


def _check_dense_part(directory: str, plan: Plan, job: TrainConfig, title: str) -> None:
    """InputError where this training's dense part is not the checkpoint's (``rec.train.model_file``)."""
    from rec.train.model_file import dense_part_problems

    problems = dense_part_problems(directory, plan.spec, job)
    if problems:
        raise InputError(title, problems)


def check_not_anothers(job: TrainConfig, out_dir: str, run: Run | None = None) -> None:
    """For a training from scratch that writes checkpoints: InputError when the newest checkpoint in
    its checkpoint directory is another run's (another ``--out``), whose steps it would overwrite
    and prune; its own earlier training's (the same ``--out``) it starts over."""
    from rec.train.ownership import another_runs
    from rec.train.resume import step_dir

    newest = _newest_checkpoint(job, out_dir) if job.checkpoint_every else None
    if newest is None:
        return
    directory, step = newest
    other = another_runs(step_dir(directory, step), run or Run.new(out_dir))
    if other is not None:
        title = f"Cannot train from scratch into {directory}: it would overwrite another run's checkpoints"
        raise InputError(title, [Problem(f"run {other.run_id}", (
            f"wrote them (--out {other.out_dir}; the newest of iteration {step}): --resume goes on from them, "
            "or give this training another --checkpoint-dir"))])


def _newest_checkpoint(job: TrainConfig, out_dir: str) -> tuple[str, int] | None:
    """The training's checkpoint directory and the step its LATEST names; None without either."""
    from rec.train.resume import checkpoint_dir, latest

    directory = checkpoint_dir(job, out_dir)
    step = latest(directory) if directory else None
    return (directory, step) if directory and step is not None else None


def _device_problems(device: str, nproc: int) -> list[Problem]:
    """The device and the torch.distributed backend the plan needs: CUDA and NCCL, or gloo.

    A cpu plan needs only torch here: the Linux builds of torch all have torch.distributed with
    gloo, and importing torch would cost the launcher seconds before torchrun (which imports it
    again) starts."""
    import importlib.util

    where = f"compute_device {device}"
    if device != "cuda":
        return (_gloo_environment_problems() if importlib.util.find_spec("torch")
                else [Problem(where, "torch is not installed")])
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return [Problem(where, f"this torch ({torch.__version__}) has no torch.distributed")]
    out = []
    if not torch.cuda.is_available():
        why = ("this torch is built without CUDA" if torch.version.cuda is None
               else "no CUDA device is visible (CUDA_VISIBLE_DEVICES, drivers)")
        out.append(Problem(where, f"the plan is for GPUs, but {why} (torch {torch.__version__}); train "
                                  "it on a machine with GPUs, or plan with compute_device: cpu"))
    elif torch.cuda.device_count() < nproc:
        out.append(Problem("--nproc-per-node", f"{nproc} processes need {nproc} GPUs; this machine has "
                                               f"{torch.cuda.device_count()}"))
    if not dist.is_nccl_available():
        out.append(Problem(where, "this torch has no NCCL, the backend cuda plans train with"))
    return out


def _gloo_environment_problems() -> list[Problem]:
    """Variables of the environment that fail every gloo rank after the launch (as a RuntimeError that
    names no variable, or a crash), named before it."""
    out = []
    given = os.environ.get("GLOO_SOCKET_IFNAME", "")
    names = [name.strip() for name in given.split(",") if name.strip()]
    if names:
        have = sorted(name for _, name in socket.if_nameindex())
        missing = [name for name in names if name not in have]
        if missing:
            out.append(Problem(f"GLOO_SOCKET_IFNAME={given}", (
                f"this machine has no network interface {', '.join(missing)} (it has {', '.join(have)}): "
                "name one of them, or unset it")))
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").strip().upper() == "DETAIL":
        out.append(Problem("TORCH_DISTRIBUTED_DEBUG=DETAIL", (
            "crashes the training's gloo ranks (SIGSEGV under torch's checking wrapper of the process group, "
            "in TorchRec's collectives): use INFO, or unset it")))
    return out


def _endpoint_problems(endpoint: str) -> list[Problem]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return [Problem("--rdzv-endpoint", f"expected HOST:PORT with a port from 1 to 65535, got {endpoint!r}")]
    try:
        socket.getaddrinfo(host.strip("[]"), int(port))
    except (socket.gaierror, UnicodeError) as e:
        return [Problem("--rdzv-endpoint", f"cannot resolve {host!r}: {getattr(e, 'strerror', None) or e}")]
    return []


def prepare(plan_path: str, out_dir: str, settings: TrainSettings, run: Run | None = None,
            reading: ExitStack | None = None) -> tuple[str, Launch]:
    """The plan's id and the checked torchrun launch of ``run``; InputError for anything that would
    fail the job for certain (see ``preflight``), the plan's soundness included. A ``--resume`` of
    another run's checkpoint says so on stderr, in one line. The checkpoint a ``--resume-from``
    names is held until ``reading`` closes (at once without it), and the ranks read that step."""
    check_settings(settings, plan_path)
    continues, notes = "", list[str]()
    job = settings.job
    with progress.step("check", "the plan, and what it needs of this machine"), ExitStack() as own:
        plan = read_plan(plan_path)
        check_plan(plan)
        nproc = preflight(settings, plan.topology, plan.spec, notes, plan)
        if settings.job.resume_from:
            job = replace(job, resume_from=str(check_resume_from(settings.job, plan, reading or own)))
        if settings.job.resume:
            continues = check_own_checkpoint(settings.job, out_dir, run, plan, settings.nnodes)
        else:
            check_not_anothers(settings.job, out_dir, run)
    for line in (continues, *notes):
        if line:
            print(line, file=sys.stderr)
    launch = Launch(plan_path=str(plan_file(plan_path)), out_dir=out_dir,
                    nproc_per_node=nproc, nnodes=settings.nnodes, node_rank=settings.node_rank,
                    rdzv_endpoint=settings.rdzv_endpoint, rdzv_id=TRAIN_RDZV_ID, join_timeout_s=settings.join_timeout,
                    max_restarts=settings.max_restarts, job=job, more_flags=(f"{PLAN_ID_FLAG}={plan.plan_id}",))
    return plan.plan_id, launch


def _check_owned_folders(settings: TrainSettings, out_dir: str) -> None:
    """InputError naming, before anything is launched, every link or special file where the training
    writes its logs and checkpoints, what it would overwrite or prune in its checkpoint directory
    that shardflow did not write there, and a folder in place of a file it writes
    (``rec.train.owned_folders``)."""
    from rec.train.metrics import ITERATIONS_FILE, METRICS_FILE
    from rec.train.owned_folders import folder_problems, output_problems, unwritten_entries
    from rec.train.resume import CHECKPOINTS, checkpoint_dir

    problems = folder_problems(log_dir(out_dir), made=True, depth=1)
    checkpoints = checkpoint_dir(settings.job, out_dir)
    if checkpoints is not None:  # made by shardflow where it is the default, inside --out
        found = folder_problems(checkpoints, made=Path(checkpoints) == Path(out_dir) / CHECKPOINTS)
        problems += found or unwritten_entries(checkpoints)
    if settings.node_rank == 0:  # node 0's rank 0 writes the metrics
        problems += output_problems(out_dir, (METRICS_FILE, ITERATIONS_FILE))
    if problems:
        raise InputError("Cannot train into these folders:", problems)


def train(plan_path: str, out_dir: str, settings: TrainSettings = TrainSettings(), attempt: int = 1) -> Trained:
    """Train with the plan at ``plan_path``; TrainingFailed if a rank failed for good. The checkpoint
    directory is this run's for the whole training (``holding_checkpoints``)."""
    from tasks.clock import now_ms

    started = now_ms()
    run = Run.new(out_dir)
    bad = control_character(run.out_dir)
    if bad:  # the ranks would refuse the run passed to them, after the launch
        raise InputError("Cannot train into this folder:", [Problem("--out", (
            f"{printable(run.out_dir)} holds the control character {bad!r}: name a folder without tabs, newlines "
            "or terminal escapes"))])
    with holding_checkpoints(settings, out_dir, run) as env, ExitStack() as reading:
        plan_id, launch = prepare(plan_path, out_dir, settings, run, reading)
        # Fault injection means "the first attempt", as inside the job; but a retry is a new torchrun
        # whose restart count starts at 0 again, so retries switch it off explicitly.
        if attempt > 1:
            env[FAIL_AT_ENV] = ""
        ranks = launch.nnodes * launch.nproc_per_node
        earlier = file_stamp(Path(out_dir) / METRICS_FILE)  # a file this run did not write is not its metrics
        again = f" (attempt {attempt})" if attempt > 1 else ""
        with progress.step("train", f"starting {counted(ranks, 'rank')}{again}"):
            finished = run_training(launch, env=env)
            if finished.code != 0:
                cause = failure_cause(launch, finished)
                raise TrainingFailed(cause.text, cause.deterministic, str(log_dir(out_dir)), attempt, cause.disk_full,
                                     cause.problems)
    written = file_stamp(Path(out_dir) / METRICS_FILE) not in (None, earlier)
    metrics = _node_metrics(launch, out_dir, written) if launch.node_rank == 0 else None
    return Trained(plan_id, out_dir, metrics, settings, launch.nproc_per_node, attempt, started,
                   launch.plan_path)


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """The file at ``path`` as one write left it (inode, size, modification time; None: no file): every
    output is renamed into place whole, so a new write is a new stamp."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _node_metrics(launch: Launch, out_dir: str, written: bool) -> TrainMetrics:
    """What global rank 0 wrote into ``out_dir`` (``written``: this run wrote the file there); InputError
    where it ran on another node: torchrun orders the nodes as they come, not by --node-rank."""
    if launch.nnodes > 1 and not written:
        found = "an earlier run's" if (Path(out_dir) / METRICS_FILE).exists() else "no"
        raise InputError("The training finished, but its metrics are on another node:", [Problem(out_dir, (
            f"{found} {METRICS_FILE}: torchrun ordered the nodes as they came, not by --node-rank, and another's "
            "ranks wrote it; give every node the same --out on a shared filesystem"))])
    return read_metrics(out_dir)


@contextmanager
def holding_checkpoints(settings: TrainSettings, out_dir: str, run: Run) -> Iterator[dict[str, str]]:
    """Hold the training's checkpoint directory for ``run`` (``rec.train.ownership``): InputError
    naming the holder, before anything is launched, when another run holds it. Yields the environment
    that passes ``run`` and the lock to the ranks."""
    from rec.train.ownership import RUN_ENV, holding
    from rec.train.resume import checkpoint_dir

    _check_owned_folders(settings, out_dir)  # before the lock is made there
    directory = checkpoint_dir(settings.job, out_dir)
    if directory is None:
        yield {RUN_ENV: run.to_json()}
        return
    with holding(directory, run, settings.node_rank) as env:
        yield dict(env)
