"""A broken MLflow store is "tracking unavailable": one line, records kept, nothing else held up.
Real MLflow on temp SQLite files that are garbage, damaged, locked, read-only or in the way."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import pytest

from tasks.outbox import ATTEMPTS_FILE, MAX_ATTEMPTS, RECORD_FILE, Outbox
from tasks.records import PARENT, PARENT_RECORD, EndRecord, RunRecord, RunStatus, RunStep, new_key, now_ms
from tasks.tracking import Tracking, TrackingUnavailable, connect
from tasks.tracking import store as store_module

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow


def record(step: str = "train", **kw) -> RunRecord:
    kw = {"start_ms": now_ms(), "end_ms": now_ms(), **kw}
    return RunRecord(key=new_key(), step=RunStep(step), name=f"{step}-test",
                     tags={"shardflow.step": step, "shardflow.plan_id": "p1", **kw.pop("tags", {})}, **kw)


@pytest.fixture(scope="module")
def healthy_db(tmp_path_factory) -> Path:
    """An MLflow database with its tables made once (MLflow's migrations take seconds)."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


def runs(uri: str, experiment: str = "shardflow") -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_read_only(path: Path) -> bool:
    """Read-only for this process, root included (chattr +i); False where that cannot be done."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        path.parent.chmod(0o555)
        return True
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def make_writable(path: Path) -> None:
    if os.geteuid() != 0:
        path.parent.chmod(0o755)
        path.chmod(0o644)
    else:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def break_store(kind: str, db: Path, healthy: Path, request: pytest.FixtureRequest):
    """Break the store at ``db`` as ``kind`` says; returns (expected reason, repair)."""
    if kind == "garbage":
        db.write_bytes(bytes(range(256)) * 64)
        return "file is not a database", lambda: shutil.copyfile(healthy, db)
    if kind == "damaged":
        shutil.copyfile(healthy, db)
        with open(db, "r+b") as f:  # keep the header, overwrite the schema pages
            f.seek(100)
            f.write(b"\xab" * 40_000)
        return "malformed", lambda: shutil.copyfile(healthy, db)
    if kind == "directory":
        db.mkdir()

        def take_the_directory_away() -> None:
            db.rmdir()
            shutil.copyfile(healthy, db)
        return "is a directory", take_the_directory_away
    if kind == "file in the way":
        db.parent.rmdir()
        db.parent.write_text("")

        def take_the_file_away() -> None:
            db.parent.unlink()
            db.parent.mkdir()
            shutil.copyfile(healthy, db)
        return "File exists", take_the_file_away
    if kind == "someone else's":  # MLflow would add its tables beside theirs
        with closing(sqlite3.connect(db)) as con:
            con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
            con.commit()
        theirs = db.read_bytes()

        def give_it_back() -> None:
            assert db.read_bytes() == theirs  # untouched while refused
            shutil.copyfile(healthy, db)
        return "is not an MLflow store (it holds other tables: users)", give_it_back
    if kind == "locked":
        shutil.copyfile(healthy, db)
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        return "database is locked", holder.close
    if kind == "read-only":
        shutil.copyfile(healthy, db)
        request.addfinalizer(lambda: make_writable(db))  # pytest must be able to remove it
        if not make_read_only(db):
            pytest.skip("cannot make a file read-only for root here (no chattr)")
        return "readonly", lambda: make_writable(db)
    raise AssertionError(kind)


KINDS = ["garbage", "damaged", "directory", "file in the way", "someone else's", "locked", "read-only"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_broken_sqlite_store_keeps_records_with_one_line_and_takes_them_once_repaired(
        kind, healthy_db, tmp_path, monkeypatch, request):
    monkeypatch.setattr(store_module, "STORE_WAIT_S", 0.2)  # the locked case: no need to wait 5 s
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    outbox = Outbox(tmp_path / "outbox")
    to = Tracking(f"sqlite:///{db}", "shardflow", str(outbox.root))
    reason, repair = break_store(kind, db, healthy_db, request)
    outbox.put(record("plan"), to=to)
    outbox.put(record("train"), to=to)

    with pytest.raises(TrackingUnavailable) as raised:
        connect(to)
    assert reason in str(raised.value) and "\n" not in str(raised.value)
    delivery = outbox.deliver(to)
    assert delivery.pending_for(to) == 2 and delivery.set_aside == ()
    assert reason in delivery.errors[to.uri] and "\n" not in delivery.errors[to.uri]
    assert delivery.errors[to.uri].startswith(f"MLflow unavailable at {to.uri} (")
    for entry in outbox.entries():  # a store that fails as a whole costs the records no attempt
        assert json.loads((entry / ATTEMPTS_FILE).read_text())["attempts"] == 0

    repair()
    delivery = outbox.deliver(to)
    assert delivery.pending == 0 and outbox.entries() == [] and outbox.set_aside_entries() == []
    assert sorted(r.info.run_name for r in runs(to.uri)) == ["plan-test", "train-test"]


def test_a_server_that_does_not_answer_is_unavailable_at_once(tmp_path):
    outbox = Outbox(tmp_path / "outbox")
    away = Tracking(f"http://127.0.0.1:{unused_port()}", "shardflow", str(outbox.root))
    outbox.put(record(), to=away)
    delivery = outbox.deliver(away)
    assert delivery.pending_for(away) == 1
    assert delivery.errors[away.uri] == f"MLflow unavailable at {away.uri} (nothing answers at this address)"


def test_a_server_that_answers_only_errors_is_unavailable_in_seconds_not_minutes(tmp_path):
    """A proxy whose MLflow is down answers 503: MLflow alone would retry each call for minutes."""
    import http.server
    import threading

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        outbox = Outbox(tmp_path / "outbox")
        proxy = Tracking(f"http://127.0.0.1:{server.server_address[1]}", "shardflow", str(outbox.root))
        outbox.put(record(), to=proxy)
        delivery = outbox.deliver(proxy)
    finally:
        server.shutdown()
    assert delivery.pending_for(proxy) == 1 and "503" in delivery.errors[proxy.uri]


def test_a_record_mlflow_refuses_is_set_aside_after_a_few_attempts_and_holds_nothing_up(
        healthy_db, tmp_path, caplog):
    db = tmp_path / "mlflow.db"
    shutil.copyfile(healthy_db, db)
    outbox = Outbox(tmp_path / "state" / "outbox")
    to = Tracking(f"sqlite:///{db}", "shardflow", str(outbox.root))
    # MLflow refuses parameter names that could resolve to other files: a record it never takes.
    poison = record("plan", params={"../escape": "x"})
    outbox.put(poison, to=to)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        fine = record("train")
        outbox.put(fine, to=to)
        with caplog.at_level(logging.WARNING, logger="tasks.outbox"):
            delivery = outbox.deliver(to)
        assert fine.key in delivery.run_ids  # delivered although an older record failed first
        if attempt < MAX_ATTEMPTS:
            (entry,) = outbox.entries()
            state = json.loads((entry / ATTEMPTS_FILE).read_text())
            assert state["attempts"] == attempt and "../escape" in state["last_error"]
            assert delivery.errors[to.uri].startswith(f"MLflow at {to.uri} did not take the plan run (")
    assert outbox.entries() == [] and delivery.pending == 0
    (aside,) = outbox.set_aside_entries()
    assert delivery.set_aside == (aside.name,) and aside.name.endswith(poison.key)
    (line,) = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert aside.name in line and f"shardflow outbox retry --state-dir {outbox.root.parent} {aside.name}" in line
    # The good records, each delivered once; what the refused one began was deleted each time.
    assert [r.info.run_name for r in runs(to.uri)] == ["train-test"] * MAX_ATTEMPTS


def test_nested_runs_go_in_while_their_parent_waits_and_are_linked_when_it_is_retried(healthy_db, tmp_path):
    db = tmp_path / "mlflow.db"
    shutil.copyfile(healthy_db, db)
    outbox = Outbox(tmp_path / "outbox")
    to = Tracking(f"sqlite:///{db}", "shardflow", str(outbox.root))
    parent = record("pipeline", status=RunStatus.RUNNING, end_ms=None, params={"../escape": "x"})
    child = record("train", parent_key=parent.key)
    for rec in (parent, child, EndRecord(parent.key, RunStatus.FINISHED, now_ms())):
        outbox.put(rec, to=to)
    for _ in range(MAX_ATTEMPTS):
        outbox.deliver(to)
    (train,) = runs(to.uri)
    assert train.data.tags[PARENT_RECORD] == parent.key and PARENT not in train.data.tags
    # The end of the parent's run went aside with it: they are retried together.
    assert len(outbox.set_aside_entries()) == 2 and outbox.entries() == []

    # Someone fixes the record (here: drops the parameter MLflow refuses) and retries it by its key.
    aside = next(e for e in outbox.set_aside_entries() if json.loads((e / RECORD_FILE).read_text())["op"] == "run")
    fixed = json.loads((aside / RECORD_FILE).read_text())
    del fixed["params"]["../escape"]
    (aside / RECORD_FILE).write_text(json.dumps(fixed))
    assert len(outbox.retry([parent.key])) == 2
    delivery = outbox.deliver(to)
    assert delivery.pending == 0 and outbox.set_aside_entries() == []
    by_step = {r.data.tags["shardflow.step"]: r for r in runs(to.uri)}
    assert by_step["pipeline"].info.status == "FINISHED"
    assert by_step["train"].data.tags[PARENT] == by_step["pipeline"].info.run_id


def test_a_damaged_record_file_is_set_aside_at_once_and_others_still_go(healthy_db, tmp_path):
    db = tmp_path / "mlflow.db"
    shutil.copyfile(healthy_db, db)
    outbox = Outbox(tmp_path / "outbox")
    to = Tracking(f"sqlite:///{db}", "shardflow", str(outbox.root))
    bad = outbox.put(record(), to=to)
    crafted = json.loads((bad / RECORD_FILE).read_text())
    crafted["artifacts"] = ["../../../etc/passwd"]  # would upload a file from outside the record
    (bad / RECORD_FILE).write_text(json.dumps(crafted))
    outbox.put(record("plan"), to=to)
    delivery = outbox.deliver(to)
    assert delivery.pending == 0 and delivery.set_aside == (bad.name,)
    assert [r.info.run_name for r in runs(to.uri)] == ["plan-test"]


def test_retrying_a_name_that_is_not_set_aside_names_it(tmp_path):
    from rec.errors import InputError

    outbox = Outbox(tmp_path / "outbox")
    with pytest.raises(InputError, match=r"'\.\./\.\./x'"):
        outbox.retry(["../../x"])
