"""A new SQLite store whose first setup (MLflow's migrations) fails midway on a full disk is left as
no store, never half migrated: once there is room, the next command that records sets it up afresh.
A store an older shardflow left half migrated is named as such, with the way out.

The disk fills for real in a child process: its file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes
every write past half a complete store's size fail with EFBIG, whatever the file system and user."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from tasks.outbox import Outbox
from tasks.records import RunRecord, RunStep, new_key, now_ms
from tasks.tracking import Tracking, TrackingUnavailable, connect
from tasks.tracking.store import check_readable, mlflow_tables
from tests.paths import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow

FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
"""

RECORD_ON_A_FULL_DISK = FULL_DISK + """
from tests.tasks.test_store_first_setup_disk_full import deliver_one
print(deliver_one(sys.argv[2], sys.argv[3]))
"""

# What a shardflow that let MLflow set a store up in place did: the migrations run on the final path.
MLFLOW_IN_PLACE_ON_A_FULL_DISK = FULL_DISK + """
from mlflow import MlflowClient
try:
    MlflowClient(sys.argv[2]).search_experiments()
except Exception:
    print("failed")
"""


def deliver_one(uri: str, outbox_dir: str) -> str:
    """Record one run (through the outbox, as every command does); what MLflow's store said, if it failed."""
    outbox = Outbox(Path(outbox_dir))
    to = Tracking(uri, "shardflow", outbox_dir)
    outbox.put(RunRecord(key=new_key(), step=RunStep("train"), name="train-test", tags={"shardflow.step": "train"},
                         start_ms=now_ms(), end_ms=now_ms()), to=to)
    return outbox.deliver(to).errors.get(uri, "")


def on_a_full_disk(script: str, limit: int, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", script, str(limit), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def run_names(uri: str) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow")
    return [] if experiment is None else [r.info.run_name for r in client.search_runs([experiment.experiment_id])]


def whole(db: Path) -> bool:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return mlflow_tables() <= tables and con.execute("SELECT 1 FROM experiments").fetchone() is not None


def test_a_first_setup_that_fills_the_disk_leaves_no_store_and_the_next_record_sets_it_up(tmp_path, mlflow_template):
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    uri, outbox = f"sqlite:///{db}", str(tmp_path / "outbox")
    limit = mlflow_template.stat().st_size // 2  # midway through MLflow's migrations

    error = on_a_full_disk(RECORD_ON_A_FULL_DISK, limit, uri, outbox)
    assert error.startswith(f"MLflow unavailable at {uri} ("), error  # the record waits in the outbox
    assert not db.exists() or whole(db)
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db.lock"]  # nothing set up aside is left

    assert deliver_one(uri, outbox) == ""  # room again: set up afresh, both records delivered
    assert whole(db) and run_names(uri) == ["train-test", "train-test"]
    assert Outbox(Path(outbox)).entries() == []


def test_a_store_an_interrupted_first_setup_left_says_so_and_how_to_get_out(tmp_path, mlflow_template):
    """Such a store fails every delivery ("table ... already exists"), and ``mlflow db upgrade`` too."""
    db = tmp_path / "mlflow.db"
    uri, outbox = f"sqlite:///{db}", str(tmp_path / "outbox")
    on_a_full_disk(MLFLOW_IN_PLACE_ON_A_FULL_DISK, mlflow_template.stat().st_size // 2, uri)
    assert db.stat().st_size > 0 and not whole(db)

    for opening in (lambda: connect(Tracking(uri, "shardflow", outbox)), lambda: check_readable(uri)):
        with pytest.raises(TrackingUnavailable) as raised:
            opening()
        message = str(raised.value)
        assert "its first setup was interrupted (alembic version " in message and "\n" not in message
        assert f"remove {db}, which holds no runs" in message and "mlflow db upgrade" not in message

    db.unlink()  # the way out it names
    assert deliver_one(uri, outbox) == "" and run_names(uri) == ["train-test"]


def test_a_store_that_lost_none_of_its_tables_is_not_taken_for_an_interrupted_setup(tmp_path, mlflow_template):
    """An older MLflow's store holds its default experiment: upgrading it is still the advice."""
    import shutil

    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_template, db)
    with closing(sqlite3.connect(db)) as con:
        con.execute("DROP TABLE " + sorted(mlflow_tables() - {"experiments"})[-1])
        con.commit()
    with pytest.raises(TrackingUnavailable, match=r"made by an older MLflow .*mlflow db upgrade"):
        check_readable(f"sqlite:///{db}")
