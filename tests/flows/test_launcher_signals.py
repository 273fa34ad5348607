"""The ranks never outlive ``shardflow train``: real 2-rank gloo trainings stopped by SIGTERM and
SIGKILL; what a stopped training leaves (consistent checkpoints, every iteration kept across a
resume); a full disk during training; the ``--out`` lock held by every process of a run.

A checkpoint directory belongs to one run at a time (docs/training.md): a second training given it
is refused before any rank starts, naming the holder; every checkpoint names the run that wrote it,
so a resume of another run's checkpoints says whose it continues, a training from scratch is
refused their directory, and a stopped run's exit line names a step it wrote. (The SIGTERM-stopped
training is one, for both.)"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest

from flows.cli import main
from rec.train import forked_forkserver
from rec.train.checkpoint import check_index
from rec.train.lifetime import LAUNCHER_MODULE
from rec.train.ownership import Run, holding, newest_own, writer_of
from rec.train.resume import latest, step_dir
from tasks.launch import TRAIN_JOB
from tasks.run_dirs import lock_dir
from tests.bytecode import without_bytecode
from tests.paths import CPU_2PROC, DEMO, ROOT, SHARDFLOW

pytestmark = pytest.mark.slow  # real torchrun trainings

GONE_WITHIN_S = 30  # a bound for the processes to be gone, far above the seconds it takes
REFUSED = "is in use by another shardflow run"
EXIT_LINE = re.compile(r"newest complete checkpoint: (\S+) \(--resume continues from it\)")


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out), "--no-chart"]) == 0
    return out


def shardflow_train(plan_dir: Path, out: Path, *args: str) -> list[str]:
    return [str(SHARDFLOW), "train", "--no-track", "--plan", str(plan_dir), "--out", str(out), "--warmup", "1",
            "--batch-size", "32", *args]


def environment(temp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(temp)}


@dataclass
class Running:
    launcher: subprocess.Popen
    stderr: Path

    def processes(self) -> list[psutil.Process]:
        """torchrun and the ranks (in sessions of their own, but descendants all the same)."""
        return psutil.Process(self.launcher.pid).children(recursive=True)

    def error_text(self) -> str:
        return self.stderr.read_text(errors="replace")


@contextlib.contextmanager
def training(plan_dir: Path, out: Path, temp: Path, *args: str):
    """A long training (``args``: more flags), running until it has written a checkpoint; every
    process of it is killed at the end of the block whatever happened."""
    stderr = out.parent / f"{out.name}.stderr"
    with open(stderr, "w") as err:
        launcher = subprocess.Popen(
            shardflow_train(plan_dir, out, "--iterations", "1000000", "--checkpoint-every", "5",
                            "--keep-checkpoints", "1", *args),
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, env=environment(temp), start_new_session=True)
    running = Running(launcher, stderr)
    seen: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while latest(out / "checkpoints") is None:
            assert launcher.poll() is None, running.error_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.2)
        seen = running.processes()
        yield running
    finally:
        launcher.kill()
        for process in seen:
            with contextlib.suppress(psutil.Error):
                process.kill()
        launcher.wait()


def ranks_and_torchrun(processes: list[psutil.Process]) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The ranks: the children of torchrun's (``rec.train.launcher``'s) forkserver, a fork of it that
    imported the job."""
    forkserver_name = forked_forkserver.PROCESS_NAME.decode()
    torchrun = [p for p in processes if LAUNCHER_MODULE in p.cmdline() and p.name() != forkserver_name]
    forkservers = [p for p in processes if p.ppid() in {t.pid for t in torchrun} and p.name() == forkserver_name
                   and TRAIN_JOB in " ".join(p.cmdline())]
    ranks = [p for p in processes if p.ppid() in {f.pid for f in forkservers}]
    assert len(ranks) == 2 and len(torchrun) == 1 and len(forkservers) == 1, [p.cmdline() for p in processes]
    return ranks, torchrun


def leftovers(temp: Path) -> list[str]:
    """What torchrun left in the temporary directory: its own, and its forkserver's (torch's compile
    cache there is meant to stay)."""
    return [p.name for p in temp.iterdir() if p.name.startswith(("torchelastic_", "pymp-"))]


def cli(args: list[str]) -> tuple[int, str]:
    """``shardflow ARGS`` in this process: its exit code and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    return code, err.getvalue()


def second_run_into(plan_dir: Path, out: Path) -> tuple[int, str]:
    return cli(["train", "--plan", str(plan_dir), "--out", str(out), "--iterations", "3", "--warmup", "1",
                "--no-track"])


def train_args(plan_dir: Path, out: Path, checkpoints: Path, *args: str) -> list[str]:
    return ["train", "--no-track", "--plan", str(plan_dir), "--out", str(out), "--checkpoint-dir",
            str(checkpoints), "--warmup", "1", "--batch-size", "32", *args]


@dataclass(frozen=True)
class Stopped:
    """A training stopped by SIGTERM after its first checkpoints, and the trainings tried meanwhile."""

    out: Path
    checkpoints: Path  # its checkpoint directory, named with --checkpoint-dir (out/checkpoints)
    temp: Path
    launcher_pid: int
    code: int
    stderr: str
    second_run: tuple[int, str]  # exit code and stderr of a training into its --out
    second: tuple[int, str]  # ... of a training given its checkpoint directory (another --out, --resume)
    second_out: Path
    left_alive: list[psutil.Process]


@pytest.fixture(scope="module")
def stopped(plan_dir, tmp_path_factory) -> Stopped:
    """A training stopped by SIGTERM after its first checkpoints."""
    tmp = tmp_path_factory.mktemp("stopped")
    out, temp, second_out = tmp / "out", tmp / "tmp", tmp / "c"
    checkpoints = out / "checkpoints"
    temp.mkdir()
    with training(plan_dir, out, temp, "--checkpoint-dir", str(checkpoints)) as running:
        processes = running.processes()
        ranks_and_torchrun(processes)
        second_run = second_run_into(plan_dir, out)
        # The run C: --resume on the same checkpoint directory, another --out (bounded, should
        # it run: a directory nobody holds lets it train).
        step = latest(checkpoints) or 0
        second = cli(train_args(plan_dir, second_out, checkpoints, "--resume", "--iterations", str(step + 20),
                                "--checkpoint-every", "2", "--keep-checkpoints", "1"))
        running.launcher.send_signal(signal.SIGTERM)
        running.launcher.wait(timeout=GONE_WITHIN_S)
        _, alive = psutil.wait_procs(processes, timeout=GONE_WITHIN_S)
        return Stopped(out, checkpoints, temp, running.launcher.pid, running.launcher.returncode,
                       running.error_text(), second_run, second, second_out, alive)


def test_sigterm_stops_torchrun_and_every_rank_and_leaves_a_complete_checkpoint(stopped):
    assert stopped.left_alive == []
    assert stopped.code == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1].startswith(
        "shardflow train: stopped by SIGTERM: torchrun and every rank have exited; newest complete checkpoint: ")
    checkpoints = stopped.out / "checkpoints"
    check_index(step_dir(checkpoints, latest(checkpoints)))  # LATEST names a complete step
    code, err = stopped.second_run
    assert code == 2 and "in use by another shardflow run" in err  # while the first one ran
    assert leftovers(stopped.temp) == []


@dataclass(frozen=True)
class Resumed:
    out: Path  # a copy of the stopped training's --out, the training resumed in it
    step: int  # the checkpoint it resumed from
    earlier: Run | None  # the run that wrote that checkpoint
    code: int
    stderr: str


@pytest.fixture(scope="module")
def resumed(stopped, plan_dir, tmp_path_factory) -> Resumed:
    """The stopped training's --out copied to a new --out, the training resumed there (--resume,
    2 iterations more, a checkpoint each): its command in this process, its torchrun in
    ``stopped.temp``."""
    out = tmp_path_factory.mktemp("resumed") / "out"
    shutil.copytree(stopped.out, out)
    checkpoints = out / "checkpoints"
    step = latest(checkpoints)
    assert step is not None
    earlier = writer_of(step_dir(checkpoints, step))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TMPDIR", str(stopped.temp))
        code, err = cli(train_args(plan_dir, out, checkpoints, "--resume", "--iterations", str(step + 2),
                                   "--checkpoint-every", "1", "--keep-checkpoints", "10"))
    return Resumed(out, step, earlier, code, err)


def test_a_resumed_training_keeps_every_iteration_and_leaves_the_first_resumed_one_out(resumed, stopped):
    out, step = resumed.out, resumed.step
    assert resumed.code == 0, resumed.stderr[-3000:]
    rows = pq.read_table(out / "iterations.parquet").to_pydict()
    assert rows["iteration"] == list(range(step + 2))
    assert [i for i, again in zip(rows["iteration"], rows["resumed"], strict=True) if again] == [step]
    measured = [ms for ms, warm, again in zip(rows["latency_ms"], rows["warmup"], rows["resumed"], strict=True)
                if not warm and not again]
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["resumed_from"] == step
    assert metrics["iteration_latency_ms"]["p50"] == pytest.approx(float(np.percentile(measured, 50)))
    assert leftovers(stopped.temp) == []


def test_a_resume_that_leaves_nothing_to_train_exits_2_before_any_rank_starts(resumed, plan_dir):
    """It once started torchrun and both ranks (5-9 s) to be refused there. A training whose newest
    checkpoint is its last iteration but whose outputs were never written (stopped between them) is
    finished by the resume instead (tests/rec/test_training_data.py)."""
    out, last = resumed.out, resumed.step + 2
    before = outputs(out)
    done = cli(train_args(plan_dir, out, out / "checkpoints", "--resume", "--iterations", str(last)))
    fewer = cli(train_args(plan_dir, out, out / "checkpoints", "--resume", "--iterations", str(last - 1)))
    assert done[0] == fewer[0] == 2, (done, fewer)
    assert "Nothing left to train" in done[1] and f"already ran its {last} iterations" in done[1]
    assert f"the newest checkpoint is of iteration {last}; --iterations {last - 1} must be above it" in fewer[1]
    assert "starting" not in done[1] + fewer[1]  # no rank started
    assert outputs(out) == before  # nothing touched


def outputs(out: Path) -> dict[Path, int]:
    """Each file of the training's (its locks aside, which every command takes) and when it was written."""
    return {f: f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file() and not f.name.endswith(".lock")}


def test_a_full_disk_during_training_is_one_line_naming_the_path_and_earlier_outputs_stay(stopped, plan_dir,
                                                                                         tmp_path):
    out = tmp_path / "out"
    shutil.copytree(stopped.out, out)
    step = latest(out / "checkpoints")
    before = (out / "iterations.parquet").read_bytes()
    limit = 1 << 20  # bytes per file: far below a checkpoint's shards (EFBIG, as a full disk gives ENOSPC)

    def file_size_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run(shardflow_train(plan_dir, out, "--resume", "--iterations", str(step + 3),
                                       "--checkpoint-every", "1"),
                       cwd=ROOT, capture_output=True, text=True, env=without_bytecode(environment(stopped.temp)),
                       timeout=600, preexec_fn=file_size_limit)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    failure = [line for line in r.stderr.splitlines() if line.startswith("shardflow train:")]
    assert len(failure) == 1, r.stderr[-3000:]
    assert f"cannot write {step_dir(out / 'checkpoints', step + 1)}" in failure[0] and "File too large" in failure[0]
    assert latest(out / "checkpoints") == step
    check_index(step_dir(out / "checkpoints", step))
    assert (out / "iterations.parquet").read_bytes() == before


def test_a_killed_launcher_takes_torchrun_and_the_ranks_with_it_and_they_hold_the_directory(plan_dir, tmp_path,
                                                                                            capfd):
    out, temp = tmp_path / "out", tmp_path / "tmp"
    temp.mkdir()
    with training(plan_dir, out, temp) as running:
        processes = running.processes()
        ranks, (torchrun,) = ranks_and_torchrun(processes)
        torchrun.suspend()  # it cannot act on its parent-death signal until it is resumed
        running.launcher.kill()
        running.launcher.wait()
        assert all(r.is_running() for r in ranks)
        code = main(["train", "--plan", str(plan_dir), "--out", str(out), "--iterations", "3", "--warmup", "1",
                     "--no-track"])
        err = capfd.readouterr().err
        assert code == 2 and "that launcher is gone" in err  # the ranks alone hold the directory
        torchrun.resume()
        _, alive = psutil.wait_procs(processes, timeout=GONE_WITHIN_S)
        assert alive == []
    with lock_dir(str(out)):  # free again
        pass


def test_a_child_started_with_the_parent_death_signal_dies_with_its_parent(tmp_path):
    """What every rank asks of the kernel for torchrun, and the launcher for torchrun."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from rec.train.lifetime import parent_death_signal\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
        " preexec_fn=parent_death_signal())\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    parent.kill()
    parent.wait()
    _, alive = psutil.wait_procs([child], timeout=GONE_WITHIN_S)
    assert alive == []


def test_a_second_training_on_a_held_checkpoint_directory_exits_2_naming_the_holder_before_any_rank(
        stopped, plan_dir, tmp_path):
    code, err = stopped.second
    writer = writer_of(step_dir(stopped.checkpoints, latest(stopped.checkpoints) or 0))
    assert writer is not None
    assert code == 2 and REFUSED in err and "Traceback" not in err, err[-3000:]
    assert f"run {writer.run_id} (--out {stopped.out}, pid {stopped.launcher_pid} " in err
    assert not stopped.second_out.exists()  # nothing launched: no logs, no outputs

    # Held again, by a run that has not stopped: a fresh training (the run B) is refused too,
    # and leaves the holder's checkpoints as they were.
    before = _files(stopped.checkpoints)
    holder = Run.new(stopped.out)
    with holding(stopped.checkpoints, holder):
        code, err = cli(train_args(plan_dir, tmp_path / "b", stopped.checkpoints, "--iterations", "10",
                                   "--checkpoint-every", "5", "--keep-checkpoints", "1"))
    assert code == 2 and REFUSED in err and holder.describe() in err, err[-3000:]
    assert not (tmp_path / "b").exists()
    assert _files(stopped.checkpoints) == before


def test_a_stopped_runs_exit_line_names_a_step_that_run_wrote(stopped):
    assert stopped.code == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    named = EXIT_LINE.findall(stopped.stderr)
    assert len(named) == 1, stopped.stderr[-3000:]
    step = Path(named[0])
    writer = writer_of(step)
    assert writer is not None and Path(writer.out_dir) == stopped.out and writer.pid == stopped.launcher_pid
    assert step == step_dir(stopped.checkpoints, latest(stopped.checkpoints) or 0)
    assert newest_own(stopped.checkpoints, stopped.out) == latest(stopped.checkpoints)
    assert newest_own(stopped.checkpoints, stopped.second_out) is None  # another run's training


def test_resuming_a_finished_runs_checkpoints_under_a_new_out_says_whose_it_continues(stopped, plan_dir,
                                                                                       tmp_path, resumed):
    checkpoints = tmp_path / "checkpoints"
    subprocess.run(["cp", "-a", str(stopped.checkpoints), str(checkpoints)], check=True)
    step = latest(checkpoints) or 0
    earlier = writer_of(step_dir(checkpoints, step))
    assert earlier is not None and Path(earlier.out_dir) == stopped.out
    # From scratch (no --resume), a training would overwrite and prune that run's steps: refused.
    before = _files(checkpoints)
    code, err = cli(train_args(plan_dir, tmp_path / "fresh", checkpoints, "--iterations", "10",
                               "--checkpoint-every", "1", "--keep-checkpoints", "1"))
    assert code == 2 and f"run {earlier.run_id}: wrote them (--out {earlier.out_dir}; " in err, err[-3000:]
    assert "--resume goes on from them" in err and "Traceback" not in err
    assert _files(checkpoints) == before and not (tmp_path / "fresh").exists()
    # With --resume (``resumed``: those checkpoints in a copy of that run's --out, resumed there).
    out, checkpoints = resumed.out, resumed.out / "checkpoints"
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert (resumed.step, resumed.earlier) == (step, earlier)
    said = [line for line in resumed.stderr.splitlines() if line.startswith("resume ")]
    assert said == [f"resume    continues the checkpoint of iteration {step} ({step_dir(checkpoints, step)}) "
                    f"that {earlier.describe()} wrote"]
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["resumed_from"] == step and metrics["resumed_run"]["run_id"] == earlier.run_id
    assert latest(checkpoints) == step + 2
    mine = writer_of(step_dir(checkpoints, step + 2))
    assert mine is not None and Path(mine.out_dir) == out and mine.run_id != earlier.run_id
    assert writer_of(step_dir(checkpoints, step)) == earlier  # the step it continued still names its writer


def _files(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``directory`` but its lock file: (size, modification time)."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file() and not p.name.startswith(".shardflow-")}
