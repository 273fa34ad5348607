"""Processes that open a new SQLite tracking store at the same moment all get a working store."""

from __future__ import annotations

import subprocess
import sys

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
