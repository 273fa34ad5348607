"""A checkpoint directory belongs to one run at a time (docs/training.md): a second training given it
is refused before any rank starts, naming the holder; every checkpoint names the run that wrote it,
so a resume of another run's checkpoints says whose it continues, a training from scratch is
refused their directory, and a stopped run's exit line names a step it wrote. Real 2-rank gloo
trainings."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from flows.cli import main
from rec.train.ownership import Run, holding, newest_own, writer_of
from rec.train.resume import latest, step_dir
from tests.paths import CPU_2PROC, DEMO, ROOT, SHARDFLOW

pytestmark = pytest.mark.slow  # real torchrun trainings

REFUSED = "is in use by another shardflow run"
EXIT_LINE = re.compile(r"newest complete checkpoint: (\S+) \(--resume continues from it\)")


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out), "--no-chart"]) == 0
    return out


def train_args(plan_dir: Path, out: Path, checkpoints: Path, *args: str) -> list[str]:
    return ["train", "--no-track", "--plan", str(plan_dir), "--out", str(out), "--checkpoint-dir",
            str(checkpoints), "--warmup", "1", "--batch-size", "32", *args]


@dataclass(frozen=True)
class Stopped:
    """A training stopped by SIGTERM after its first checkpoints, and a second one tried meanwhile."""

    out: Path
    checkpoints: Path
    launcher_pid: int
    code: int
    stderr: str
    second: tuple[int, str]  # exit code and stderr of the training tried on the held directory
    second_out: Path


@pytest.fixture(scope="module")
def stopped(plan_dir, tmp_path_factory) -> Stopped:
    tmp = tmp_path_factory.mktemp("owned")
    out, checkpoints, second_out = tmp / "a", tmp / "checkpoints", tmp / "c"
    stderr = tmp / "a.stderr"
    with open(stderr, "w") as err:
        launcher = subprocess.Popen(
            [str(SHARDFLOW), *train_args(plan_dir, out, checkpoints, "--iterations", "1000000",
                                         "--checkpoint-every", "5", "--keep-checkpoints", "1")],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while latest(checkpoints) is None:
            assert launcher.poll() is None, stderr.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.2)
        # The run C: --resume on the same checkpoint directory, another --out (bounded, should
        # it run: a directory nobody holds lets it train).
        step = latest(checkpoints) or 0
        second = _cli(train_args(plan_dir, second_out, checkpoints, "--resume", "--iterations", str(step + 20),
                                 "--checkpoint-every", "2", "--keep-checkpoints", "1"))
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
    finally:
        launcher.kill()
        launcher.wait()
    return Stopped(out, checkpoints, launcher.pid, launcher.returncode, stderr.read_text(errors="replace"),
                   second, second_out)


def _cli(args: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    return code, err.getvalue()


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
        code, err = _cli(train_args(plan_dir, tmp_path / "b", stopped.checkpoints, "--iterations", "10",
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
                                                                                       tmp_path):
    checkpoints = tmp_path / "checkpoints"
    subprocess.run(["cp", "-a", str(stopped.checkpoints), str(checkpoints)], check=True)
    step = latest(checkpoints) or 0
    earlier = writer_of(step_dir(checkpoints, step))
    assert earlier is not None and Path(earlier.out_dir) == stopped.out
    # From scratch (no --resume), a training would overwrite and prune that run's steps: refused.
    before = _files(checkpoints)
    code, err = _cli(train_args(plan_dir, tmp_path / "fresh", checkpoints, "--iterations", "10",
                                "--checkpoint-every", "1", "--keep-checkpoints", "1"))
    assert code == 2 and f"run {earlier.run_id}: wrote them (--out {earlier.out_dir}; " in err, err[-3000:]
    assert "--resume goes on from them" in err and "Traceback" not in err
    assert _files(checkpoints) == before and not (tmp_path / "fresh").exists()
    out = tmp_path / "c"
    code, err = _cli(train_args(plan_dir, out, checkpoints, "--resume", "--iterations", str(step + 2),
                                "--checkpoint-every", "1", "--keep-checkpoints", "10"))
    assert code == 0, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("resume ")]
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
