"""Each outbox record goes to the MLflow it was meant for, whichever flow delivers it."""

from __future__ import annotations

import socket
import sqlite3
from contextlib import closing

import pytest

from tasks.outbox import Outbox
from tasks.records import RunRecord, RunStep, new_key, now_ms
from tasks.tracking import Tracking, connect

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
    connect(a)  # a's store exists (a record is never what creates a store but its own command's)
    outbox.put(record("plan"), to=away)  # meant for a server that is down
    outbox.put(record("train"), to=a)

    delivery = outbox.deliver(b)  # a flow that logs to b delivers what waits
    assert run_names(a.uri) == ["train-test"]
    assert not (tmp_path / "b.db").exists()  # the record for the dead server did not land here
    assert delivery.waiting == {away.uri: 1} and delivery.pending_for(b) == 0
    (waiting,) = outbox.entries()
    assert outbox.destination(waiting, b) == away


def test_a_record_for_a_store_that_does_not_exist_waits_and_creates_nothing_there(tmp_path):
    """A to.json naming another SQLite path (edited, or a store since removed) creates no store there;
    the record waits, with one line, until a command that logs there delivers it."""
    outbox = Outbox(tmp_path / "outbox")
    elsewhere = tmp_path / "elsewhere" / "mlflow.db"
    meant = Tracking(f"sqlite:///{elsewhere}", "shardflow", str(outbox.root))
    not_mlflow = tmp_path / "app.db"  # some other program's SQLite file: MLflow must not add its tables
    with closing(sqlite3.connect(not_mlflow)) as con:
        con.execute("CREATE TABLE mine (x)")
        con.commit()
    outbox.put(record("plan"), to=meant)
    outbox.put(record("train"), to=Tracking(f"sqlite:///{not_mlflow}", "shardflow", str(outbox.root)))
    own = Tracking(f"sqlite:///{tmp_path / 'own.db'}", "shardflow", str(outbox.root))

    delivery = outbox.deliver(own)
    assert not elsewhere.exists() and not elsewhere.parent.exists()
    with closing(sqlite3.connect(not_mlflow)) as con:
        assert {row[0] for row in con.execute("SELECT name FROM sqlite_master")} == {"mine"}
    assert delivery.pending == 2 and delivery.set_aside == ()
    reason = delivery.errors[meant.uri]
    assert f"no MLflow store at {elsewhere}" in reason and "\n" not in reason
    assert "shardflow outbox retry --tracking-uri" in reason
    assert "is not an MLflow store" in delivery.errors[f"sqlite:///{not_mlflow}"]

    # The command that logs there creates its store and takes the record.
    delivery = outbox.deliver(meant)
    assert meant.uri not in delivery.waiting and run_names(meant.uri) == ["plan-test"]


def test_a_record_mlflow_did_not_take_ends_its_step_kept_in_the_outbox_not_done(tmp_path):
    """`train` printed `MLflow: done in 2.35 s`, then that MLflow was unavailable."""
    from rec import progress
    from tasks.recorder import record as recorded

    events: list[progress.Event] = []
    away = Tracking(f"http://127.0.0.1:{unused_port()}", "shardflow", str(tmp_path / "outbox"))
    with progress.reporting(events.append):
        logged = recorded(away, record("train"))
        taken = recorded(Tracking(f"sqlite:///{tmp_path / 'a.db'}", "shardflow", str(tmp_path / "outbox2")),
                         record("train"))
    assert logged.unrecorded and logged.pending == 1 and not taken.unrecorded
    assert [(e.ok, e.ended) for e in events if e.kind == "end"] == [(True, "kept in the outbox"), (True, None)]
