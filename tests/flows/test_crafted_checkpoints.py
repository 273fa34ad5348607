"""``shardflow train --resume-from DIR`` and ``--resume`` refuse a crafted checkpoint index before
launch: exit 2, one problem line, nothing in it run, nothing written."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from flows.cli import main
from rec.train.resume import step_dir
from tests.paths import CPU_2PROC, DEMO


def text(value: str) -> bytes:
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def payloads(marker: Path) -> dict[str, bytes]:
    """Indexes that create ``marker`` when plain pickle loads them."""
    run = text(f"touch {marker}") + b"\x85R."  # TUPLE1, REDUCE, STOP
    return {
        "protocol 2 GLOBAL": b"\x80\x02cos\nsystem\n" + run,
        "protocol 4 STACK_GLOBAL, dotted": b"\x80\x04" + text("torch.distributed.checkpoint.metadata")
        + text("os.system") + b"\x93" + run,
    }


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out), "--no-chart"]) == 0
    return out


def checkpoints_with(index: bytes, directory: Path, plan_dir: Path) -> Path:
    """A checkpoint directory whose newest step (LATEST) has ``index`` as its .metadata."""
    step = step_dir(directory, 4)
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(index)
    (directory / "LATEST").write_text(step.name)
    shutil.copy(plan_dir / "plan.json", directory / "plan.json")
    return directory


def assert_refused(code: int, err: str, marker: Path) -> None:
    assert code == 2, err
    assert not marker.exists()
    assert "Traceback" not in err and ".metadata: not a checkpoint index shardflow reads" in err
    message = err[err.index("shardflow: "):].strip().splitlines()  # after the progress lines
    assert len(message) == 2 and "nothing in it was run" in message[1]  # the title, one problem


@pytest.mark.parametrize("shape", sorted(payloads(Path("m"))))
def test_resume_from_a_crafted_checkpoint_exits_2_before_launch(plan_dir, tmp_path, capfd, shape):
    marker = tmp_path / "ran"
    old = checkpoints_with(payloads(marker)[shape], tmp_path / "old" / "checkpoints", plan_dir)
    code = main(["train", "--plan", str(plan_dir), "--out", str(tmp_path / "new"), "--iterations", "6",
                 "--warmup", "1", "--resume-from", str(old.parent), "--no-track"])
    assert_refused(code, capfd.readouterr().err, marker)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("shape", sorted(payloads(Path("m"))))
def test_resume_of_a_training_whose_checkpoint_was_replaced_exits_2_before_launch(plan_dir, tmp_path, capfd,
                                                                                    shape):
    marker = tmp_path / "ran"
    out = tmp_path / "out"
    checkpoints_with(payloads(marker)[shape], out / "checkpoints", plan_dir)
    code = main(["train", "--plan", str(plan_dir), "--out", str(out), "--iterations", "6", "--warmup", "1",
                 "--resume", "--no-track"])
    assert_refused(code, capfd.readouterr().err, marker)
    assert not (out / "logs").exists() and not (out / "train_metrics.json").exists()


def test_resume_into_the_checkpoints_of_another_plan_is_refused_naming_resume_from(plan_dir, tmp_path, capfd):
    """Its ranks would reshard them, but the checkpoint directory's plan copy, its older steps and the
    training's iterations would then mix two plans. Refused before its index is read."""
    topology = tmp_path / "half_batch.yaml"
    topology.write_text(CPU_2PROC.read_text().replace("batch_size: 512", "batch_size: 256"))
    other = tmp_path / "other_plan"
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(topology), "--out", str(other),
                 "--no-chart"]) == 0
    marker = tmp_path / "ran"
    out = tmp_path / "out"
    checkpoints = checkpoints_with(payloads(marker)["protocol 2 GLOBAL"], out / "checkpoints", other)
    capfd.readouterr()
    code = main(["train", "--plan", str(plan_dir), "--out", str(out), "--iterations", "6", "--warmup", "1",
                 "--resume", "--no-track"])
    err = capfd.readouterr().err
    assert code == 2 and "Traceback" not in err and not marker.exists()
    message = err[err.index("shardflow: "):].strip().splitlines()
    assert len(message) == 2 and message[1].startswith(f"  - {checkpoints}: holds plan ")
    assert "--resume-from this directory, with another --out" in message[1]
    assert not (out / "logs").exists() and not (out / "train_metrics.json").exists()
