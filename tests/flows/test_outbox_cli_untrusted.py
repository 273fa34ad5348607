"""Through the real CLI, beside an outbox that someone else wrote into (linked artifacts and
entries, a FIFO, /dev/zero and a 300 GiB file as records, a count and destinations that cannot be
believed): `outbox list` and `outbox retry` neither hang nor read them, say one line per entry,
upload nothing from outside the outbox and create no store; `run --plan-only` plans and records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.outbox import ATTEMPTS_FILE, DESTINATION_FILE, RECORD_FILE, Outbox
from tasks.records import RunRecord, RunStep, new_key, now_ms
from tasks.tracking import tracking_for
from tests.paths import CPU_2PROC, DEMO, SHARDFLOW
from tests.stores import store_from

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow

SECRET = "the content of a file outside the outbox"
CONTROL_URI = "sqlite:////tmp/shardflow-test-\x1b[31mred.db"


def record(step: str = "plan", artifacts: tuple[str, ...] = ()) -> RunRecord:
    return RunRecord(key=new_key(), step=RunStep(step), name=f"{step}-test", start_ms=now_ms(), end_ms=now_ms(),
                     tags={"shardflow.step": step, "shardflow.plan_id": "p1"}, artifacts=artifacts)


def hostile_outbox(cwd: Path) -> dict[str, tuple[str, str]]:
    """The default outbox of ``cwd`` with one good record and entries that must not be trusted;
    entry name -> (what it is, the problem `outbox list` names)."""
    tracking = tracking_for(f"sqlite:///{cwd / 'mlflow.db'}", state_dir=str(cwd / ".shardflow"))
    outbox = Outbox(tracking.outbox_dir)
    (cwd / "secret").mkdir()
    (cwd / "secret" / "rank_load.png").write_text(SECRET)
    (cwd / "made.png").write_text("a chart")
    bad: dict[str, tuple[str, str]] = {}

    def put(what: str, problem: str, artifacts: tuple[str, ...] = ()) -> Path:
        entry = outbox.put(record(artifacts=artifacts), dict.fromkeys(artifacts, cwd / "made.png"), to=tracking)
        bad[entry.name] = (what, problem)
        return entry

    entry = put("linked artifact", "artifact 'rank_load.png': is a symbolic link", ("rank_load.png",))
    (entry / "rank_load.png").unlink()
    (entry / "rank_load.png").symlink_to(cwd / "secret" / "rank_load.png")
    entry = put("linked folder", "artifact 'logs/rank_load.png': is a symbolic link", ("logs/rank_load.png",))
    for name in os.listdir(entry / "logs"):
        (entry / "logs" / name).unlink()
    (entry / "logs").rmdir()
    (entry / "logs").symlink_to(cwd / "secret", target_is_directory=True)
    entry = put("linked entry", "the entry is a symbolic link")
    (cwd / "elsewhere").mkdir()
    os.replace(entry, cwd / "elsewhere" / entry.name)
    entry.symlink_to(cwd / "elsewhere" / entry.name, target_is_directory=True)
    entry = put("FIFO", "record.json is a FIFO")
    (entry / RECORD_FILE).unlink()
    os.mkfifo(entry / RECORD_FILE)
    entry = put("/dev/zero", "record.json is a symbolic link")
    (entry / RECORD_FILE).unlink()
    (entry / RECORD_FILE).symlink_to("/dev/zero")
    entry = put("huge", "record.json is 300.0 GiB")
    with open(entry / RECORD_FILE, "r+b") as f:
        f.truncate(300 << 30)  # sparse
    entry = put("attempts", "attempts.json: attempts -1000000 is not a whole number from 0 to 3")
    (entry / ATTEMPTS_FILE).write_text(json.dumps({"attempts": -1_000_000}))
    entry = put("control characters", r"tracking URI 'sqlite:////tmp/shardflow-test-\x1b[31mred.db': contains control")
    (entry / DESTINATION_FILE).write_text(json.dumps({"uri": CONTROL_URI, "experiment": "shardflow"}))
    outbox.put(record("train"), to=tracking)
    return bad


def shardflow(cwd: Path, *args: str, timeout: int = 300, **env_vars: str) -> tuple[int, str, int]:
    """Exit code, everything printed, and the command's peak memory (KiB) — under a time limit,
    so a read that blocks fails the test instead of hanging it."""
    measure = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]);"
               "print('maxrss', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr);"
               "sys.exit(r.returncode)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SHARDFLOW_"))} | env_vars
    r = subprocess.run([sys.executable, "-c", measure, str(SHARDFLOW), *args], cwd=cwd, capture_output=True,
                       text=True, env=env, timeout=timeout)
    *printed, peak = (r.stdout + r.stderr).rstrip("\n").split("\n")
    assert peak.startswith("maxrss "), peak
    return r.returncode, "\n".join(printed), int(peak.split()[1])


def plan_runs(uri: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow")
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


def test_outbox_list_and_retry_beside_entries_that_cannot_be_trusted(tmp_path, mlflow_template):
    bad = hostile_outbox(tmp_path)
    store_from(mlflow_template, tmp_path)  # the good record's store, its tables made (not this test's subject)

    code, out, peak_kib = shardflow(tmp_path, "outbox", "list", timeout=120)
    assert code == 0 and "Traceback" not in out and "\x1b" not in out, out
    assert peak_kib < 1 << 20, peak_kib  # KiB: under 1 GiB, nothing read whole
    for name, (what, problem) in bad.items():
        (row,) = [line for line in out.splitlines() if line.startswith(name)]
        assert "waiting" in row and problem in row, (what, row)
    from flows.commands.compare import _waiting  # what compare counts under its table

    tracking = tracking_for(f"sqlite:///{tmp_path / 'mlflow.db'}", state_dir=str(tmp_path / ".shardflow"))
    assert _waiting(Outbox(tracking.outbox_dir), tracking) == (1, 0, len(bad))  # not "for another store"

    code, out, _ = shardflow(tmp_path, "outbox", "retry", timeout=300)
    assert code == 0 and "Traceback" not in out and "\x1b" not in out, out
    assert "delivered 1 record(s) to MLflow" in out
    for name, (what, problem) in bad.items():
        (line,) = [line for line in out.splitlines() if name in line]
        assert "set aside" in line and problem in line, (what, line)
    assert len(out.splitlines()) == len(bad) + 1, out
    assert [r.info.run_name for r in plan_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")] == ["train-test"]
    assert all(SECRET not in p.read_text(errors="replace") for p in (tmp_path / "mlruns").rglob("*") if p.is_file())
    assert not Path(CONTROL_URI.removeprefix("sqlite:///")).exists()
    assert sorted(os.listdir(tmp_path / "elsewhere")) and all(
        sorted(os.listdir(p)) == sorted([DESTINATION_FILE, RECORD_FILE]) for p in (tmp_path / "elsewhere").iterdir())

    code, out, _ = shardflow(tmp_path, "outbox", "list", timeout=120)
    assert code == 0 and "\x1b" not in out
    for name, (what, problem) in bad.items():
        (row,) = [line for line in out.splitlines() if line.startswith(name)]
        assert "set aside" in row and problem in row, (what, row)


@pytest.mark.slow  # a Prefect server
def test_run_plan_only_plans_and_records_beside_entries_that_cannot_be_trusted(tmp_path, prefect_api,
                                                                                mlflow_template):
    bad = hostile_outbox(tmp_path)
    store_from(mlflow_template, tmp_path)  # the default store, its tables made (not this test's subject)
    # On the test server: starting Prefect's embedded server is not this test's subject.
    code, out, _ = shardflow(tmp_path, "run", "--plan-only", str(DEMO), "--topology", str(CPU_2PROC),
                             timeout=600, PREFECT_API_URL=prefect_api)
    assert code == 0 and "Traceback" not in out, out
    runs = plan_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert sorted(r.data.tags["shardflow.step"] for r in runs) == ["plan", "train"], out  # ours, and the good one
    aside = {p.name for p in (tmp_path / ".shardflow" / "outbox" / "set-aside").iterdir()}
    assert aside == set(bad)
    assert all(SECRET not in p.read_text(errors="replace") for p in (tmp_path / "mlruns").rglob("*") if p.is_file())
