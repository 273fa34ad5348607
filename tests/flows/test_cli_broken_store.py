"""Through the real CLI: a broken MLflow store never stops the work, says so in one line, keeps
the records, holds up no later run, and the records reach MLflow once it is repaired."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from flows.cli import main
from tests.flows.cli_in_process import shardflow_here
from tests.paths import CPU_2PROC, DEMO, SHARDFLOW
from tests.stores import store_from

pytestmark = [pytest.mark.slow,  # a Prefect server and a training
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # SQLAlchemy, from MLflow


def shardflow(cwd: Path, *args: str, **env_vars: str) -> tuple[int, str]:
    """Exit code and everything printed (stdout and stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SHARDFLOW_"))} | env_vars
    r = subprocess.run([str(SHARDFLOW), *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=900)
    return r.returncode, r.stdout + r.stderr


def shardflow_in(cwd: Path, monkeypatch, capfd, *args: str) -> tuple[int, str]:
    """``shardflow(cwd, *args)``, in this process: exit code and everything printed."""
    for name in [k for k in os.environ if k.startswith(("MLFLOW_", "SHARDFLOW_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(cwd)
    r = shardflow_here(capfd, *args)
    return r.returncode, r.stdout + r.stderr


def plan_runs(uri: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow")
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], "tags.`shardflow.step` = 'plan'")


def assert_quiet(output: str) -> None:
    assert "Traceback" not in output and "ERROR" not in output, output
    assert "Downloading artifacts" not in output and "View run" not in output, output


def test_a_corrupt_store_neither_stops_planning_nor_blocks_later_runs_and_is_delivered_once_repaired(
        tmp_path, prefect_api, mlflow_template, monkeypatch, capfd):
    (tmp_path / "mlflow.db").write_bytes(b"not a database at all " * 1000)  # the default store, corrupt
    code, out = shardflow(tmp_path, "run", "--plan-only", str(DEMO), "--topology", str(CPU_2PROC),
                          PREFECT_API_URL=prefect_api)
    assert code == 0, out
    assert_quiet(out)
    (line,) = [x for x in out.splitlines() if "MLflow unavailable" in x]
    assert "mlflow.db (file is not a database); 1 record(s) kept in" in line and "shardflow outbox retry" in line
    assert len(out.splitlines()) <= 8, out
    outbox = tmp_path / ".shardflow" / "outbox"
    (waiting,) = [p for p in outbox.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert (waiting / "plan.json").is_file()

    # Every later run works, to a healthy store, while the record for the broken one waits.
    healthy = store_from(mlflow_template, tmp_path / "healthy")  # its tables made
    code, out = shardflow(tmp_path, "run", "--plan-only", str(DEMO), "--topology", str(CPU_2PROC),
                          "--tracking-uri", healthy, PREFECT_API_URL=prefect_api)
    assert code == 0, out
    assert_quiet(out)
    assert len([x for x in out.splitlines() if "MLflow unavailable" in x]) == 1  # the other store's record
    (run,) = plan_runs(healthy)
    plan_id = run.data.tags["shardflow.plan_id"]
    assert waiting.is_dir()

    # A plan fetched from MLflow shows no progress bars.
    code, out = shardflow(tmp_path, "plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", "again",
                          "--previous-plan-id", plan_id, "--tracking-uri", healthy)
    assert code == 0, out
    assert_quiet(out)

    (tmp_path / "mlflow.db").unlink()  # repaired: MLflow makes a new store here
    code, out = shardflow_in(tmp_path, monkeypatch, capfd, "outbox", "retry")
    assert code == 0 and "delivered 1 record(s)" in out, out
    assert not waiting.exists()
    assert [r.data.tags["shardflow.plan_id"] for r in plan_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")] == [plan_id]
    code, out = shardflow_in(tmp_path, monkeypatch, capfd, "outbox", "list")
    assert code == 0 and "nothing waits" in out


def test_training_with_mlflow_down_exits_0_with_one_line_and_keeps_the_train_run(tmp_path, monkeypatch, capfd):
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "plan")]) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out = shardflow(tmp_path, "train", "--plan", str(tmp_path / "plan"), "--out", "run", "--iterations", "4",
                          "--warmup", "1", "--batch-size", "32", "--tracking-uri", f"http://127.0.0.1:{port}")
    assert code == 0, out
    assert_quiet(out)
    (line,) = [x for x in out.splitlines() if x.startswith("MLflow")]
    assert line.startswith(f"MLflow unavailable at http://127.0.0.1:{port} (nothing answers")
    assert "1 record(s) kept in" in line
    outbox = tmp_path / ".shardflow" / "outbox"
    (kept,) = [p for p in outbox.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert {"record.json", "to.json", "train_metrics.json", "iterations.parquet"} <= {p.name for p in kept.iterdir()}
    code, out = shardflow_in(tmp_path, monkeypatch, capfd, "outbox", "list")
    assert code == 0 and kept.name in out and "waiting" in out and "nothing answers" in out
