"""Prefect tasks that record plans and trainings in MLflow, through the outbox.

Each task writes its record to the outbox and delivers what is waiting there: with MLflow up, the
run appears at once; with MLflow away, the record waits on disk and a later delivery sends it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rec.plan import Plan
from tasks import records
from tasks.ingest import Inputs
from tasks.outbox import Delivery, Outbox
from tasks.plan_fetch import fetch_plan
from tasks.records import EndRecord, RunRecord
from tasks.tracking import Tracking, TrackingUnavailable, connect, last_planning
from tasks.train import Trained


@dataclass(frozen=True)
class Logged:
    """A record and, once MLflow has it, its run id (None while it waits in the outbox)."""

    key: str
    run_id: str | None
    pending: int  # records still waiting in the outbox after this one


@dataclass
class ParentRun:
    """A pipeline/replan run: the flow sets ``plan_id`` once the plan is known; ``run_id`` and
    ``pending`` say, after the block, whether MLflow has it."""

    key: str
    plan_id: str
    run_id: str | None = None
    pending: int = 0


def _record(tracking: Tracking, record: RunRecord | EndRecord,
            files: dict[str, Path] | None = None) -> Logged:
    outbox = Outbox(tracking.outbox_dir)
    outbox.put(record, files)
    delivery = outbox.deliver(tracking)
    if delivery.pending:
        get_run_logger().warning("MLflow unavailable (%s): %d record(s) wait in %s",
                                 delivery.error, delivery.pending, outbox.root)
    return Logged(record.key, delivery.run_ids.get(record.key), delivery.pending)


@task(name="deliver-outbox", cache_policy=NO_CACHE)
def deliver_outbox(tracking: Tracking) -> Delivery:
    """Send records that waited while MLflow was away (every flow starts with this)."""
    delivery = Outbox(tracking.outbox_dir).deliver(tracking)
    if delivery.run_ids:
        get_run_logger().info("delivered %d waiting record(s) to MLflow", len(delivery.run_ids))
    if delivery.pending:
        get_run_logger().warning("MLflow unavailable (%s): %d record(s) still wait in %s",
                                 delivery.error, delivery.pending, tracking.outbox_dir)
    return delivery


@task(name="log-plan", cache_policy=NO_CACHE)
def log_plan(tracking: Tracking, plan: Plan, plan_path: str, inputs: Inputs,
             parent: ParentRun | None = None, planning_s: float | None = None) -> Logged:
    """A plan run with params, metrics, plan.json, shards.parquet and the chart; none if MLflow
    already has a finished run of this plan_id."""
    record = records.plan_record(plan, inputs, parent.key if parent else None, planning_s)
    plan_dir = Path(plan_path).parent
    return _record(tracking, record, {name: plan_dir / name for name in record.artifacts})


@task(name="log-training", cache_policy=NO_CACHE)
def log_training(tracking: Tracking, trained: Trained, parent: ParentRun | None = None) -> Logged:
    """A train run: latency percentiles, samples/s and the per-iteration latency series."""
    record = records.train_record(trained, parent.key if parent else None)
    out = Path(trained.out_dir)
    return _record(tracking, record, {name: out / name for name in record.artifacts})


@task(name="start-run", cache_policy=NO_CACHE)
def start_run(tracking: Tracking, record: RunRecord) -> Logged:
    return _record(tracking, record)


@task(name="end-run", cache_policy=NO_CACHE)
def end_run(tracking: Tracking, record: EndRecord) -> Logged:
    return _record(tracking, record)


@contextmanager
def parent_run(tracking: Tracking, step: str, inputs: Inputs, plan_id: str,
               params: dict[str, str] | None = None,
               tags: dict[str, str] | None = None) -> Iterator[ParentRun]:
    """A RUNNING pipeline/replan run for the block; FINISHED after it, FAILED if it raises."""
    name = f"{step}-{Path(inputs.spec_path).stem}"
    record = records.parent_record(step, name, plan_id, inputs, params or {}, tags)
    run = ParentRun(record.key, plan_id)
    start_run(tracking, record)
    status = "FAILED"
    try:
        yield run
        status = "FINISHED"
    finally:
        ended = end_run(tracking, EndRecord(run.key, status, records.now_ms(),
                                            {records.PLAN_ID: run.plan_id}))
        run.run_id, run.pending = ended.run_id, ended.pending


@task(name="record-unchanged", cache_policy=NO_CACHE)
def record_unchanged(tracking: Tracking, inputs: Inputs, plan_id: str) -> Logged:
    return _record(tracking, records.unchanged_record(inputs, plan_id))


@dataclass(frozen=True)
class LastPlanning:
    spec_hash: str
    plan_id: str
    run_id: str


@task(name="find-last-planning", cache_policy=NO_CACHE)
def find_last_planning(tracking: Tracking, inputs: Inputs) -> LastPlanning | None:
    """The newest successful planning of this spec file on this topology; None if there is none
    or MLflow cannot be reached (then replanning is the safe answer, and cheap when cached)."""
    try:
        client, experiment_id = connect(tracking)
    except TrackingUnavailable as e:
        get_run_logger().warning("MLflow unavailable (%s): cannot compare with the last plan", e)
        return None
    run = last_planning(client, experiment_id, inputs.spec_path, inputs.topology.topology_hash)
    if run is None:
        return None
    tags = run.data.tags
    return LastPlanning(tags[records.SPEC_HASH], tags[records.PLAN_ID], run.info.run_id)


fetch_plan_task = task(name="fetch-plan", cache_policy=NO_CACHE)(fetch_plan)  # for train_flow
