"""A full disk is one error naming what could not be written; what was written before stays whole;
a rank whose disk is full still gets its cause to the launcher."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rec.disk_full import DiskFull, disk_full_cause, writing
from rec.train.rank_log import error_from_line, read_errors
from tests.bytecode import without_bytecode
from tests.paths import ROOT


def run_limited(code: str, file_size_limit: int, cwd: Path) -> subprocess.CompletedProcess:
    """``code`` in a Python process that may write files of at most ``file_size_limit`` bytes
    (writing more fails with EFBIG, as a full disk fails with ENOSPC)."""
    prelude = (f"import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, ({file_size_limit}, "
               f"{file_size_limit}))\n")
    env = without_bytecode({"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_write_to_a_full_device_is_one_error_naming_the_output(tmp_path):
    with pytest.raises(DiskFull) as raised, writing(tmp_path / "out.bin"), open("/dev/full", "w") as f:
        f.write("x")
        f.flush()
    assert str(raised.value) == f"cannot write {tmp_path / 'out.bin'}: No space left on device"


def test_a_disk_full_error_is_found_behind_the_per_rank_failures_of_a_checkpoint():
    from torch.distributed.checkpoint.api import CheckpointException

    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    wrapped = CheckpointException("save failed", {0: (RuntimeError("unexpected pos"), None), 1: (quota, None)})
    assert disk_full_cause(wrapped) is quota
    assert disk_full_cause(CheckpointException("save failed", {0: (RuntimeError("other"), None)})) is None


def test_iterations_that_do_not_fit_leave_the_earlier_file_whole(tmp_path):
    r = run_limited(f"""
        import numpy as np
        from rec.disk_full import DiskFull
        from rec.train.metrics import Iterations, write_iterations
        write_iterations({str(tmp_path)!r}, Iterations.of_run(0, np.ones(3), np.ones(3), 1))
        try:
            write_iterations({str(tmp_path)!r}, Iterations.of_run(0, np.ones(200_000), np.ones(200_000), 1))
        except DiskFull as e:
            print(e)
        """, 64 * 1024, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"cannot write {tmp_path / 'iterations.parquet'}: File too large"
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "iterations.parquet").num_rows == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iterations.parquet"]  # no temporary file left


def test_a_rank_whose_disk_is_full_keeps_running_and_sends_its_cause_to_the_launcher(tmp_path):
    r = run_limited(f"""
        from rec.disk_full import DiskFull
        from rec.train.rank_log import RankOutput
        output = RankOutput({str(tmp_path)!r}, rank=3, local_rank=1)
        print("a line for the log, which no longer fits")
        output.failed(DiskFull("/out/checkpoints/step_00000008", OSError(28, "No space left on device")))
        """, 0, tmp_path)
    assert r.returncode == 0, r.stderr
    sent = [e for e in map(error_from_line, r.stdout.splitlines()) if e is not None]
    assert [(e.rank, e.cause, e.disk_full) for e in sent] == [
        (3, "cannot write /out/checkpoints/step_00000008: No space left on device", True)]
    assert read_errors(tmp_path) == [] and read_errors(tmp_path, tuple(sent)) == sent  # no file: the pipe
    assert [p.name for p in (tmp_path / "logs").iterdir()] == ["rank-3.log"]


@pytest.mark.parametrize("ext", ["yaml", "csv", "parquet"])
def test_a_spec_that_does_not_fit_leaves_the_earlier_spec_whole(tmp_path, ext):
    """``spec from-model`` once wrote in place: a cut YAML spec read back as a valid one of fewer tables."""
    out = tmp_path / f"tables.{ext}"
    r = run_limited(f"""
        from rec.disk_full import DiskFull
        from rec.spec import write_spec
        from rec.spec.synthetic import power_law_spec
        write_spec(power_law_spec(20, seed=1), {str(out)!r})
        try:
            write_spec(power_law_spec(3000, seed=2), {str(out)!r})
        except DiskFull as e:
            print(e)
        """, 16 * 1024, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"cannot write {out}: File too large"
    from rec.spec import read_spec

    assert len(read_spec(out)) == 20  # the earlier spec, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no temporary file left


def test_an_export_whose_weights_do_not_fit_names_the_file_and_leaves_none(tmp_path):
    """safetensors' own error once reached the terminal as a traceback."""
    r = run_limited(f"""
        import torch
        from pathlib import Path
        from rec.disk_full import DiskFull, whole
        from rec.train.export import _save_weights
        final = Path({str(tmp_path)!r}) / "model.safetensors"
        try:
            with whole(final) as path:
                _save_weights({{"t": torch.ones(100_000)}}, path, final)
        except DiskFull as e:
            print(e)
        """, 16 * 1024, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"cannot write {tmp_path / 'model.safetensors'}: File too large"
    assert list(tmp_path.iterdir()) == []


def test_spec_from_model_on_a_full_disk_is_one_line_and_keeps_the_spec_there(tmp_path):
    out = tmp_path / "tables.yaml"
    out.write_text("tables:\n- {name: kept, num_embeddings: 10, embedding_dim: 4}\n")
    r = run_limited(f"""
        import sys
        from flows.cli import main
        sys.exit(main(["spec", "from-model", "tests.rec.model_factories:sparse_nn", "--out", {str(out)!r}]))
        """, 256, tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == (f"shardflow spec from-model: cannot write {out}: File too large; nothing was "
                                "written")
    assert "kept" in out.read_text() and sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_a_training_that_filled_the_disk_is_not_retried_by_prefect(tmp_path):
    """`shardflow run` once retried it twice, seconds apart, on the same full disk."""
    from prefect.states import Failed

    from rec.train.rank_log import RankOutput
    from tasks.launch import Finished, Launch, failure_cause
    from tasks.retry import worth_retrying
    from tasks.train import TrainingFailed

    RankOutput(str(tmp_path), rank=1, local_rank=1).failed(
        DiskFull(tmp_path / "checkpoints" / "step_00000008", OSError(errno.ENOSPC, "No space left on device")))
    cause = failure_cause(Launch("plan.json", str(tmp_path), 2), Finished(1))
    assert cause.disk_full and not cause.deterministic
    full = TrainingFailed(cause.text, cause.deterministic, str(tmp_path / "logs"), 1, cause.disk_full)
    assert not worth_retrying(None, None, Failed(data=full))
    assert worth_retrying(None, None, Failed(data=TrainingFailed("rank 0 exited with SIGKILL", False, "logs", 1)))


def test_a_plan_whose_chart_does_not_fit_names_the_chart_and_keeps_the_earlier_plan(tmp_path):
    """It named the plan's directory (or, for another fault, the writer's temporary folder)."""
    topology = ROOT / "examples" / "topologies" / "cpu_2proc.yaml"
    r = run_limited(f"""
        from rec.plan.io import write_plan_files
        from rec.planning import plan_spec
        from rec.spec.synthetic import power_law_spec
        from rec.topology import read_topology
        plan = plan_spec(power_law_spec(6, seed=1), read_topology({str(topology)!r}))
        write_plan_files(plan, {str(tmp_path / 'plan')!r})
        try:
            write_plan_files(plan, {str(tmp_path / 'plan')!r},
                             extra=lambda d: (d / "rank_load.png").write_bytes(b"x" * 100_000))
        except OSError as e:
            print(e.filename, e.strerror)
        """, 64 * 1024, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{tmp_path / 'plan' / 'rank_load.png'} File too large"
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == ["plan.json", "shards.parquet"]



@pytest.mark.parametrize("name", ["p" * 247 + ".parquet", "é" * 123 + ".json"])
def test_an_output_with_a_name_of_up_to_255_bytes_is_written_whole(tmp_path, name):
    """`predict --out` of a legal 251-255-byte name failed on its temporary file (5 bytes longer)."""
    from rec.disk_full import write_whole

    assert len(name.encode()) > 250
    write_whole(tmp_path / name, "data")
    assert [p.name for p in tmp_path.iterdir()] == [name] and (tmp_path / name).read_text() == "data"
