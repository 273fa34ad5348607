"""The outbox delivers records to a real MLflow (SQLite) in order, nested, exactly once."""

from __future__ import annotations

import pytest

from tasks.outbox import Outbox
from tasks.records import EndRecord, RunRecord, RunStatus, RunStep, new_key, now_ms
from tasks.tracking import Tracking

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow


def run_record(step: str, plan_id: str = "p1", **kw) -> RunRecord:
    kw = {"start_ms": now_ms(), "end_ms": now_ms(), **kw}
    return RunRecord(key=new_key(), step=RunStep(step), name=f"{step}-test",
                     tags={"shardflow.step": step, "shardflow.plan_id": plan_id}, **kw)


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def runs(uri: str, experiment: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id],
                                                     order_by=["attributes.start_time ASC"])


def test_records_wait_while_mlflow_is_away_then_arrive_in_order_and_nested(mlflow_db, tmp_path):
    outbox = Outbox(tmp_path / "outbox")
    away = Tracking("http://127.0.0.1:9", "nested", str(outbox.root))
    parent = run_record("pipeline", status=RunStatus.RUNNING, end_ms=None)
    child = run_record("train", parent_key=parent.key, metrics={"samples_per_s": 5.0},
                       series={"iteration_latency_ms": [[0, 2.0], [1, 1.5]]})
    for record in (parent, child, EndRecord(parent.key, RunStatus.FINISHED, now_ms(), {"shardflow.plan_id": "p2"})):
        outbox.put(record)
        assert outbox.deliver(away).pending > 0
    assert len(outbox.entries()) == 3

    delivery = outbox.deliver(Tracking(mlflow_db, "nested", str(outbox.root)))
    assert delivery.pending == 0 and outbox.entries() == []
    steps = {r.data.tags["shardflow.step"]: r for r in runs(mlflow_db, "nested")}
    pipeline, train = steps["pipeline"], steps["train"]
    assert pipeline.info.status == train.info.status == "FINISHED"
    assert pipeline.data.tags["shardflow.plan_id"] == "p2"  # the EndRecord's tags
    assert train.data.tags["mlflow.parentRunId"] == pipeline.info.run_id
    assert train.data.metrics["samples_per_s"] == 5.0


def test_a_record_delivered_twice_makes_one_run_and_a_plan_is_logged_once(mlflow_db, tmp_path):
    outbox = Outbox(tmp_path / "outbox")
    tracking = Tracking(mlflow_db, "once", str(outbox.root))
    record = run_record("train")
    outbox.put(record)
    outbox.put(record)  # as if the process died after MLflow took it, before removing the entry
    first = run_record("plan", plan_id="same", unique_plan=True)
    outbox.put(first)
    outbox.put(run_record("plan", plan_id="same", unique_plan=True))  # the same plan, planned again
    delivery = outbox.deliver(tracking)
    assert delivery.pending == 0
    assert sorted(r.data.tags["shardflow.step"] for r in runs(mlflow_db, "once")) == ["plan", "train"]
    assert len(set(delivery.run_ids.values())) == 2


def test_one_plan_planned_from_two_spec_files_gets_a_run_for_each_and_racing_deliveries_one(mlflow_db, tmp_path):
    """A copy of a planned spec, planned again, got no run of its own (one per plan_id): `replan` of the copy,
    which looks a file's last plan up by its path, then said "first plan". Three commands delivering one
    plan at once each saw no run yet, and made one each."""
    import threading

    def planned(spec_path: str) -> RunRecord:
        return RunRecord(key=new_key(), step=RunStep.PLAN, name="plan-test", start_ms=now_ms(), end_ms=now_ms(),
                         unique_plan=True, tags={"shardflow.step": "plan", "shardflow.plan_id": "copied",
                                                 "shardflow.spec_path": spec_path})

    tracking = Tracking(mlflow_db, "copies", str(tmp_path / "outbox"))
    outboxes = [Outbox(tmp_path / f"outbox-{i}") for i in range(3)]
    for outbox in outboxes:
        outbox.put(planned("/specs/s.yaml"))
    threads = [threading.Thread(target=outbox.deliver, args=(tracking,)) for outbox in outboxes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outboxes[0].put(planned("/specs/team's copy.yaml"))  # a quote in a path: a search of its own
    assert outboxes[0].deliver(tracking).pending == 0
    assert sorted(r.data.tags["shardflow.spec_path"] for r in runs(mlflow_db, "copies")) == [
        "/specs/s.yaml", "/specs/team's copy.yaml"]
    assert not list(tmp_path.glob("*.plan-runs.lock")) and not (tmp_path.parent / "mlflow.db.plan-runs.lock").exists()


def test_an_outbox_on_a_full_disk_loses_the_record_in_one_line_and_fails_nothing(tmp_path):
    """A full --state-dir once failed a training that had succeeded ("cannot write train_metrics.json",
    the artifact it was copying) and left hidden temporary entries behind for good."""
    from tests.rec.test_disk_full import run_limited

    (tmp_path / "train_metrics.json").write_bytes(b"{}" + b" " * 100_000)  # an artifact too big to copy
    outbox = tmp_path / "outbox"
    r = run_limited(f"""
        from pathlib import Path
        from tasks.outbox import kept_message
        from tasks.recorder import record
        from tasks.records import RunRecord, RunStep, new_key, now_ms
        from tasks.tracking import Tracking
        tracking = Tracking("sqlite:///{tmp_path / 'mlflow.db'}", "full", {str(outbox)!r})
        rec = RunRecord(key=new_key(), step=RunStep("train"), name="train-test", tags={{}}, start_ms=now_ms(),
                        end_ms=now_ms(), artifacts=("train_metrics.json",))
        logged = record(tracking, rec, {{"train_metrics.json": Path({str(tmp_path / 'train_metrics.json')!r})}})
        print(logged.unrecorded, kept_message(tracking, logged.pending, logged.error, logged.lost))
        """, 16 * 1024, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"True MLflow record not kept: cannot write {outbox}: File too large; the command's "
                                "own outputs are written")
    assert list(outbox.iterdir()) == []  # no temporary entry left
    assert not (tmp_path / "mlflow.db").exists()  # nothing half delivered


def test_an_outbox_that_cannot_be_made_loses_the_record_in_one_line(tmp_path):
    """Any OS error of the outbox (here a file in its place; a read-only filesystem alike) once failed the
    command whose work was done."""
    from tasks.outbox import kept_message
    from tasks.recorder import record

    (tmp_path / "state").write_text("a file where the state directory goes")
    tracking = Tracking(f"sqlite:///{tmp_path / 'mlflow.db'}", "lost", str(tmp_path / "state" / "outbox"))
    logged = record(tracking, run_record("train"))
    assert logged.unrecorded and kept_message(tracking, logged.pending, logged.error, logged.lost) == (
        f"MLflow record not kept: cannot write {tmp_path / 'state' / 'outbox'}: Not a directory; the command's own "
        "outputs are written")
