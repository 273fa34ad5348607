"""Each outbox record goes to the MLflow it was meant for, whichever flow delivers it."""

from __future__ import annotations

import socket

import pytest

from tasks.outbox import Outbox
from tasks.records import RunRecord, RunStep, new_key, now_ms
from tasks.tracking import Tracking

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow


def record(step: str) -> RunRecord:
    return RunRecord(key=new_key(), step=RunStep(step), name=f"{step}-test", start_ms=now_ms(), end_ms=now_ms(),
                     tags={"shardflow.step": step, "shardflow.plan_id": "p1"})


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_names(uri: str) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow")
    return [] if experiment is None else [r.info.run_name for r in client.search_runs([experiment.experiment_id])]


def test_records_wait_for_their_own_server_and_never_land_in_another_store(tmp_path):
    outbox = Outbox(tmp_path / "outbox")
    a = Tracking(f"sqlite:///{tmp_path / 'a.db'}", "shardflow", str(outbox.root))
    b = Tracking(f"sqlite:///{tmp_path / 'b.db'}", "shardflow", str(outbox.root))
    away = Tracking(f"http://127.0.0.1:{unused_port()}", "shardflow", str(outbox.root))
    outbox.put(record("plan"), to=away)  # meant for a server that is down
    outbox.put(record("train"), to=a)

    delivery = outbox.deliver(b)  # a flow that logs to b delivers what waits
    assert run_names(a.uri) == ["train-test"]
    assert not (tmp_path / "b.db").exists()  # the record for the dead server did not land here
    assert delivery.waiting == {away.uri: 1} and delivery.pending_for(b) == 0
    (waiting,) = outbox.entries()
    assert outbox.destination(waiting, b) == away
