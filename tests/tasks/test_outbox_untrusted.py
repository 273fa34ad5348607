"""Nothing the outbox holds is trusted: a link (an artifact, a folder on an artifact's way, the
entry itself), a FIFO, a device, a huge file, an edited count, destination or record sets the entry
aside with one line naming it and the problem; nothing is raised, read whole or uploaded, and the
other records and the work go on. Real files, a real MLflow on temporary SQLite files."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

import pytest

from tasks.outbox import ATTEMPTS_FILE, DESTINATION_FILE, RECORD_FILE, Outbox
from tasks.outbox_entry import MAX_RECORD_BYTES
from tasks.records import RunRecord, RunStep, new_key, now_ms
from tasks.tracking import Tracking
from tests.deadline import deadline

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow

SECRET = "the content of a file outside the outbox"


def record(step: str = "plan", **kw) -> RunRecord:
    kw = {"start_ms": now_ms(), "end_ms": now_ms(), **kw}
    return RunRecord(key=new_key(), step=RunStep(step), name=f"{step}-test",
                     tags={"shardflow.step": step, "shardflow.plan_id": "p1"}, **kw)




@pytest.fixture(scope="module")
def template_db(tmp_path_factory) -> Path:
    """An MLflow database with its tables made once (MLflow's migrations take seconds)."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def store(template_db, tmp_path) -> Tracking:
    """The delivering command's own store (artifacts next to it, in store/mlruns)."""
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    shutil.copyfile(template_db, db)
    return Tracking(f"sqlite:///{db}", "shardflow", str(tmp_path / "state" / "outbox"))


def runs(uri: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow")
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


def set_aside_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tasks.outbox"]


def assert_set_aside_alone(outbox: Outbox, store: Tracking, bad: Path, problem: str, caplog) -> None:
    """Delivering sets ``bad`` aside with one line naming it and ``problem``; a good record beside it
    goes, and nothing is raised or left waiting."""
    good = record("train")
    outbox.put(good, to=store)
    with deadline(60), caplog.at_level(logging.WARNING, logger="tasks.outbox"):
        delivery = outbox.deliver(Tracking(store.uri, store.experiment, str(outbox.root)))
    assert delivery.set_aside == (bad.name,) and delivery.pending == 0
    assert list(delivery.run_ids) == [good.key]
    assert [r.info.run_name for r in runs(store.uri)] == ["train-test"]
    (line,) = set_aside_lines(caplog)
    assert bad.name in line and problem in line and "\n" not in line, line
    assert os.path.lexists(outbox.set_aside_dir / bad.name) and outbox.entries() == []


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


@pytest.mark.parametrize("how", ["file", "folder"])
def test_a_linked_artifact_is_never_uploaded_and_its_entry_is_set_aside(how, store, tmp_path, caplog):
    secret = tmp_path / "secret"
    secret.mkdir()
    for name in ("rank_load.png", "rank-0.log"):
        (secret / name).write_text(SECRET)
    made = tmp_path / "made.txt"
    made.write_text("an artifact the run made")
    outbox = Outbox(store.outbox_dir)
    name = "rank_load.png" if how == "file" else "logs/rank-0.log"
    bad = outbox.put(record(artifacts=(name,)), {name: made}, to=store)
    if how == "file":  # ln -sf /secret <entry>/rank_load.png
        (bad / name).unlink()
        (bad / name).symlink_to(secret / "rank_load.png")
    else:  # a linked folder, and a name in it that `artifacts` lists
        shutil.rmtree(bad / "logs")
        (bad / "logs").symlink_to(secret, target_is_directory=True)

    assert_set_aside_alone(outbox, store, bad, f"artifact '{name}': is a symbolic link", caplog)
    (listed,) = outbox.describe()
    assert listed.set_aside and f"artifact '{name}': is a symbolic link" in (listed.problem or "")
    uploaded = files_under(tmp_path / "store")
    assert all(SECRET not in p.read_text(errors="replace") for p in uploaded)


def test_artifacts_go_up_from_a_checked_copy_under_their_own_names(store, tmp_path):
    from mlflow import MlflowClient

    (tmp_path / "out").mkdir()
    for name in ("rank_load.png", "rank-0.log"):
        (tmp_path / "out" / name).write_text(f"made: {name}")
    outbox = Outbox(store.outbox_dir)
    rec = record(artifacts=("rank_load.png", "logs/rank-0.log", "movement.parquet"))  # the last: not made
    outbox.put(rec, {"rank_load.png": tmp_path / "out" / "rank_load.png",
                     "logs/rank-0.log": tmp_path / "out" / "rank-0.log"}, to=store)
    delivery = outbox.deliver(store)
    client = MlflowClient(store.uri)
    run_id = delivery.run_ids[rec.key]
    assert {a.path for a in client.list_artifacts(run_id)} == {"rank_load.png", "logs"}
    got = Path(client.download_artifacts(run_id, "logs/rank-0.log", str(tmp_path / "down")))
    assert got.read_text() == "made: rank-0.log"


def test_a_linked_entry_is_set_aside_as_a_link_and_the_recording_step_still_works(store, tmp_path, caplog):
    from tasks.recorder import record as record_and_deliver

    outbox = Outbox(store.outbox_dir)
    linked = outbox.put(record(), to=store)
    elsewhere = tmp_path / "elsewhere" / linked.name
    elsewhere.parent.mkdir()
    os.replace(linked, elsewhere)
    linked.symlink_to(elsewhere, target_is_directory=True)
    before = sorted(os.listdir(elsewhere))

    # What `run --plan-only` and `train` do at "MLflow: recording": put their record, deliver all.
    with deadline(60), caplog.at_level(logging.WARNING, logger="tasks.outbox"):
        logged = record_and_deliver(store, record("train"))
    assert logged.run_id is not None and logged.pending == 0 and logged.error is None
    assert [r.info.run_name for r in runs(store.uri)] == ["train-test"]  # not the record behind the link
    aside = outbox.set_aside_dir / linked.name
    assert aside.is_symlink() and Path(os.readlink(aside)) == elsewhere  # the link moved, not followed
    assert sorted(os.listdir(elsewhere)) == before  # nothing written, moved or removed there
    (line,) = set_aside_lines(caplog)
    assert linked.name in line and "the entry is a symbolic link" in line

    (listed,) = outbox.describe()
    assert listed.set_aside and listed.record is None and "symbolic link" in (listed.problem or "")
    assert outbox.retry() == [linked]  # back in the queue, still a link: set aside again, nothing raised
    delivery = outbox.deliver(store)
    assert delivery.set_aside == (linked.name,) and delivery.pending == 0
    assert sorted(os.listdir(elsewhere)) == before


def fifo(path: Path) -> None:
    os.mkfifo(path)


def link_to_dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def dev_zero_itself(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's device numbers
    except PermissionError:
        pytest.skip("making a device file needs root")


def huge(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(300 << 30)  # 300 GiB, sparse: a reader that reads it whole never finishes


@pytest.mark.parametrize(("make", "problem"), [
    (fifo, "record.json is a FIFO (named pipe), not a regular file"),
    (link_to_dev_zero, "record.json is a symbolic link, not a regular file"),
    (dev_zero_itself, "record.json is a device, not a regular file"),
    (huge, f"record.json is 300.0 GiB, more than the {MAX_RECORD_BYTES >> 20}.0 MiB read for it"),
])
def test_a_record_file_that_is_no_regular_file_or_too_big_is_set_aside_unread(make, problem, store, caplog):
    outbox = Outbox(store.outbox_dir)
    bad = outbox.put(record(), to=store)
    (bad / RECORD_FILE).unlink()
    make(bad / RECORD_FILE)
    with deadline(30):
        (listed,) = outbox.describe()  # `outbox list`: neither hangs nor reads it
    assert listed.record is None and listed.problem == problem
    assert_set_aside_alone(outbox, store, bad, problem, caplog)


@pytest.mark.parametrize("attempts", [-1_000_000, -1, 4, 10**12, True, 1.5, "2", None, [1]])
def test_an_attempts_count_that_cannot_be_believed_sets_the_entry_aside(attempts, store, caplog):
    outbox = Outbox(store.outbox_dir)
    bad = outbox.put(record(), to=store)
    (bad / ATTEMPTS_FILE).write_text(json.dumps({"attempts": attempts, "last_error": "x"}))
    assert_set_aside_alone(outbox, store, bad, "attempts.json: attempts", caplog)
    assert json.loads((outbox.set_aside_dir / bad.name / ATTEMPTS_FILE).read_text())["attempts"] == 0


@pytest.mark.parametrize(("content", "problem"), [
    ({"uri": "sqlite:////tmp/x\x1b[31mred.db", "experiment": "shardflow"},
     r"to.json: tracking URI 'sqlite:////tmp/x\x1b[31mred.db': contains control characters"),
    ({"uri": "http://127.0.0.1:5000", "experiment": "../../escape"}, "contains a path separator"),
    ({"uri": "http://127.0.0.1:5000", "experiment": "\n"}, "experiment '\\n': is empty"),
    ({"uri": "", "experiment": "shardflow"}, "the tracking URI is empty"),
    ({"uri": 7, "experiment": "shardflow"}, "tracking URI: must be text, got int"),
    ({"uri": "http://127.0.0.1:5000", "experiment": "shardflow", "token": "x"}, "not an object of"),
    (["http://127.0.0.1:5000"], "not an object of"),
])
def test_a_destination_that_the_users_own_flags_would_refuse_sets_the_entry_aside(content, problem, store, caplog):
    outbox = Outbox(store.outbox_dir)
    bad = outbox.put(record(), to=store)
    (bad / DESTINATION_FILE).write_text(json.dumps(content))
    assert_set_aside_alone(outbox, store, bad, problem, caplog)
    assert all("\x1b" not in line for line in set_aside_lines(caplog))  # escaped, never raw on a terminal
    assert not Path("/tmp/x\x1b[31mred.db").exists()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda d: {**d, "metrics": {"x": "fast"}}, "metrics is not an object of numbers"),
    (lambda d: {**d, "metrics": {"x": 10**400}}, "metrics is not an object of numbers"),
    (lambda d: {**d, "start_ms": 2**70}, "start_ms or end_ms is not a time in milliseconds"),
    (lambda d: {**d, "series": {"loss": [[0, 1.0], [1]]}}, "series is not an object of [step, value] lists"),
    (lambda d: {**d, "tags": {"shardflow.step": ["plan"]}}, "tags is not an object of text values"),
    (lambda d: {**d, "key": new_key()}, "is not the entry's"),
    (lambda d: {**d, "artifacts": ["../../../etc/passwd"]}, "an artifact name is not a relative path"),
    (lambda d: nested(100_000), "record.json: not a shardflow record"),
])
def test_a_record_with_values_shardflow_never_writes_is_set_aside_not_raised(edit, problem, store, caplog):
    outbox = Outbox(store.outbox_dir)
    bad = outbox.put(record(), to=store)
    edited = edit(json.loads((bad / RECORD_FILE).read_text()))
    (bad / RECORD_FILE).write_text(edited if isinstance(edited, str) else json.dumps(edited))
    assert_set_aside_alone(outbox, store, bad, problem, caplog)


def test_a_name_that_is_no_entry_of_shardflow_is_set_aside(store, tmp_path, caplog):
    outbox = Outbox(store.outbox_dir)
    real = outbox.put(record(), to=store)
    bad = outbox.root / "not-an-entry"
    os.replace(real, bad)
    assert_set_aside_alone(outbox, store, bad, "the entry is not named <time>-<record key>", caplog)


def test_a_linked_lock_file_or_set_aside_folder_is_not_followed(store, tmp_path, caplog):
    outbox = Outbox(store.outbox_dir)
    victim = tmp_path / "victim.txt"
    victim.write_text("must stay as it is")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outbox.root.mkdir(parents=True)
    (outbox.root / ".lock").symlink_to(victim)  # opened for writing, it would be emptied
    outbox.set_aside_dir.symlink_to(elsewhere, target_is_directory=True)  # set aside out of the outbox
    bad = outbox.put(record(), to=store)
    (bad / ATTEMPTS_FILE).write_text(json.dumps({"attempts": -1}))

    with caplog.at_level(logging.WARNING, logger="tasks.outbox"):
        delivery = outbox.deliver(store)
    assert victim.read_text() == "must stay as it is" and os.listdir(elsewhere) == []
    assert outbox.set_aside_dir.is_dir() and not outbox.set_aside_dir.is_symlink()
    assert [p.name for p in outbox.set_aside_entries()] == list(delivery.set_aside) == [bad.name]
    assert delivery.pending == 0
    (moved,) = outbox.entries()  # the link that stood in set-aside/'s place: now a bad entry of the queue
    assert moved.is_symlink() and Path(os.readlink(moved)) == elsewhere
    assert outbox.deliver(store).set_aside == (moved.name,)
    assert os.listdir(elsewhere) == [] and victim.read_text() == "must stay as it is"


def test_a_plan_read_from_the_outbox_is_copied_without_following_links(store, tmp_path):
    from rec.plan.io import PLAN_FILE
    from tasks.records import PLAN_ID

    outbox = Outbox(store.outbox_dir)
    (tmp_path / "plan.json").write_text("{}")
    rec = RunRecord(key=new_key(), step=RunStep.PLAN, name="plan-x", tags={PLAN_ID: "0123456789abcdef"},
                    artifacts=(PLAN_FILE,))
    entry = outbox.put(rec, {PLAN_FILE: tmp_path / "plan.json"}, to=store)
    assert outbox.copy_plan("0123456789abcdef", tmp_path / "a") == tmp_path / "a" / PLAN_FILE
    (entry / PLAN_FILE).unlink()
    (entry / PLAN_FILE).symlink_to(tmp_path / "plan.json")
    assert outbox.copy_plan("0123456789abcdef", tmp_path / "b") is None
    assert not (tmp_path / "b").exists()


def test_a_store_that_is_only_named_by_a_record_is_not_probed_through_a_fifo(store, tmp_path):
    """A to.json naming a FIFO as its SQLite file: SQLite's open would block; the record waits."""
    os.mkfifo(tmp_path / "fifo.db")
    outbox = Outbox(store.outbox_dir)
    meant = Tracking(f"sqlite:///{tmp_path / 'fifo.db'}", "shardflow", str(outbox.root))
    outbox.put(record(), to=meant)
    with deadline(30):
        delivery = outbox.deliver(store)
    assert delivery.waiting == {meant.uri: 1} and "is not an MLflow store file" in delivery.errors[meant.uri]
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo.db").st_mode)
    with closing(sqlite3.connect(store.uri.removeprefix("sqlite:///"))) as con:  # nothing went to the own store
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
