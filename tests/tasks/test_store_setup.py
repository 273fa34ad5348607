"""Processes that open a new SQLite tracking store at the same moment all get a working store."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading

import pytest

from tests.paths import ROOT

OPEN_STORE = """
import sys
from tasks.tracking import Tracking, connect
client, experiment_id = connect(Tracking(sys.argv[1], "race", sys.argv[2]))
print(experiment_id)
"""


def test_two_processes_creating_one_store_at_once_both_record(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_STORE, uri, str(tmp_path / f"outbox{i}")], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-500:] for _, err in results]
    assert len({out.strip() for out, _ in results}) == 1  # one experiment, found by all

    from mlflow import MlflowClient

    assert MlflowClient(uri).get_experiment_by_name("race") is not None


def test_a_reader_waits_while_another_process_sets_the_store_up(tmp_path, mlflow_template, monkeypatch):
    """``compare`` and ``ui`` on a store a recording command was making read it half made, as "not an
    MLflow store" then "made by an older MLflow: upgrade it (mlflow db upgrade)", which run beside the
    migration under way leaves the store half migrated for good."""
    from rec.file_lock import open_lock_file, release, take
    from tasks.tracking import store
    from tasks.tracking.store import STORE_LOCK_SUFFIX, TrackingUnavailable, check_readable

    db = tmp_path / "mlflow.db"
    db.write_bytes(b"")  # as MLflow's first moment leaves it
    setting_up = open_lock_file(tmp_path / f"mlflow.db{STORE_LOCK_SUFFIX}")
    take(setting_up)  # another process opening the store (an open file of its own)

    def made() -> None:
        shutil.copyfile(mlflow_template, db)
        release(setting_up)

    threading.Timer(0.5, made).start()
    check_readable(f"sqlite:///{db}")  # waited, then found the store whole
    take(setting_up)
    monkeypatch.setattr(store, "STORE_WAIT_S", 0.2)
    with pytest.raises(TrackingUnavailable, match="is being set up by another process"):
        check_readable(f"sqlite:///{db}")
