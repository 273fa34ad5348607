"""Prefect tasks that record plans and trainings in MLflow, through the outbox (``tasks.recorder``).

Each task writes its record to the outbox and delivers what is waiting there: with MLflow up, the
run appears at once; with MLflow away, the record waits on disk and a later delivery sends it.
Runs recorded by a flow carry the Prefect flow run's id (``shardflow.prefect_flow_run``), and a
plan run's per-rank table becomes a markdown artifact of the flow run naming the MLflow run.

MLflow trouble never fails a task: the records wait, and the flow run's log says so once per
destination (marked ``TRACKING_WARNING``: the CLI, which says it itself at the end, hides it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rec.plan import Plan
from tasks import records
from tasks.ingest import Inputs
from tasks.outbox import Delivery, Outbox, kept_message, unavailable
from tasks.plan_fetch import fetch_plan
from tasks.recorder import Logged, record, record_failed_training, record_training
from tasks.records import EndRecord, RunRecord, RunStatus, RunStep
from tasks.tracking import (
    TRACKING_WARNING,
    Tracking,
    TrackingUnavailable,
    connect,
    last_planning,
    tracking_failure,
)
from tasks.train import Trained, TrainSettings

__all__ = [
    "LastPlanning",
    "Logged",
    "ParentRun",
    "PlanningLookup",
    "deliver_outbox",
    "fetch_plan_task",
    "find_last_planning",
    "log_failed_training",
    "log_plan",
    "log_training",
    "parent_run",
    "previous_plan_task",
]


@dataclass
class ParentRun:
    """A pipeline/replan run: the flow tells it the plan (``add_plan``) and the training
    (``add_training``) once known, and its end carries their headline params and metrics;
    ``run_id``, ``pending`` and ``error`` say, after the block, whether MLflow has it (and why not)."""

    key: str
    plan_id: str
    run_id: str | None = None
    pending: int = 0
    error: str | None = None
    lost: str | None = None  # why its end could not be kept (``Logged.lost``)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def add_plan(self, plan: Plan) -> None:
        self.plan_id = plan.plan_id
        self.params.update(records.plan_params(plan))
        self.metrics.update(records.plan_metrics(plan))

    def add_training(self, trained: Trained) -> None:
        if trained.metrics:  # node 0's
            self.params["batch_size"] = str(trained.metrics.batch_size)
            plan_batch = self.params.get("topology.batch_size")
            self.metrics.update(records.train_metrics(trained.metrics, int(plan_batch) if plan_batch else None,
                                                      self.metrics.get(records.PREDICTED)))


def _flow_run_tags() -> dict[str, str]:
    from prefect.runtime import flow_run

    run_id = flow_run.id
    return {records.PREFECT_FLOW_RUN: str(run_id)} if run_id else {}


_warned: set[tuple[str, str]] = set()  # (flow run, tracking URI): said once per flow run


def _warn_kept(tracking: Tracking, logged: Logged) -> None:
    """One warning per flow run and destination that a record waits or was lost (``kept_message``)."""
    _warn(tracking, kept_message(tracking, logged.pending, logged.error, logged.lost))


def _warn(tracking: Tracking, message: str, reported_by_cli: bool = True) -> None:
    from prefect.runtime import flow_run

    seen = (str(flow_run.id), tracking.uri)
    if seen in _warned:
        return
    _warned.add(seen)
    get_run_logger().warning(message, extra={TRACKING_WARNING: True} if reported_by_cli else None)


def _record(tracking: Tracking, rec: RunRecord | EndRecord, files: dict[str, Path] | None = None) -> Logged:
    logged = record(tracking, rec, files)
    if logged.unrecorded:
        _warn_kept(tracking, logged)
    return logged


@task(name="deliver-outbox", cache_policy=NO_CACHE)
def deliver_outbox(tracking: Tracking) -> Delivery:
    """Send records that waited while MLflow was away, each to where it was meant to go (every
    flow starts with this)."""
    delivery = Outbox(tracking.outbox_dir).deliver(tracking)
    if delivery.run_ids:
        get_run_logger().info("delivered %d waiting record(s) to MLflow", len(delivery.run_ids))
    for uri, waiting in delivery.waiting.items():
        # The CLI reports its own destination at the end; records for another one only here.
        elsewhere = Tracking(uri, tracking.experiment, tracking.outbox_dir)
        _warn(elsewhere, kept_message(elsewhere, waiting, delivery.errors.get(uri)),
              reported_by_cli=uri == tracking.uri)
    return delivery


@task(name="log-plan", cache_policy=NO_CACHE)
def log_plan(tracking: Tracking, plan: Plan, plan_path: str, inputs: Inputs,
             parent: ParentRun | None = None, planning_s: float | None = None) -> Logged:
    """A plan run with params, metrics, plan.json, shards.parquet and the chart (none if MLflow
    already has a finished run of this plan_id), and the per-rank table as a Prefect artifact."""
    rec = records.plan_record(plan, inputs, parent.key if parent else None, planning_s, _flow_run_tags())
    plan_dir = Path(plan_path).parent
    logged = _record(tracking, rec, {name: plan_dir / name for name in rec.artifacts})
    _publish_rank_table(plan, tracking, logged)
    return logged


def _publish_rank_table(plan: Plan, tracking: Tracking, logged: Logged) -> None:
    from prefect.artifacts import create_markdown_artifact

    from rec.analysis.iteration_time import cost_model_label
    from rec.plan.report import markdown, rank_table

    m = plan.metrics
    if logged.run_id is None:
        where = f"waiting in the outbox for MLflow at `{tracking.uri}`"
    elif tracking.uri.startswith(("http://", "https://")):
        where = f"[{logged.run_id}]({tracking.uri.rstrip('/')}/#/runs/{logged.run_id})"
    else:
        where = f"`{logged.run_id}` in experiment `{tracking.experiment}` at `{tracking.uri}`"
    text = (f"### Plan `{plan.plan_id}`: {len(plan.tables):,} tables on {plan.world_size:,} ranks\n\n"
            f"critical path {m.critical_path:.4f} ms, lower bound {m.lower_bound:.4f} ms, gap "
            f"{100 * m.gap:.2f}% ({cost_model_label(plan)})\n\nMLflow plan run: {where}\n\n"
            f"{markdown(rank_table(plan))}\n")
    create_markdown_artifact(markdown=text, key=f"plan-{plan.plan_id}",
                             description=f"per-rank load of plan {plan.plan_id}")


@task(name="log-training", cache_policy=NO_CACHE)
def log_training(tracking: Tracking, trained: Trained, parent: ParentRun | None = None,
                 inputs: Inputs | None = None) -> Logged:
    """A train run: latency percentiles beside the plan's predicted critical path, samples/s,
    loss, the per-iteration series, and what the plan was made for (``inputs``: by name too)."""
    logged = record_training(tracking, trained, parent.key if parent else None, _flow_run_tags(), inputs)
    if logged.unrecorded:
        _warn_kept(tracking, logged)
    return logged


@task(name="log-failed-training", cache_policy=NO_CACHE)
def log_failed_training(tracking: Tracking, plan_id: str, settings: TrainSettings, out_dir: str,
                        error: str, attempts: int, started_ms: int,
                        parent: ParentRun | None = None, plan_path: str = "") -> Logged:
    """A FAILED train run with the cause (``records.error_tag``), the logs and the plan's params."""
    logged = record_failed_training(tracking, plan_id, settings, out_dir, error, attempts, started_ms,
                                    parent.key if parent else None, _flow_run_tags(), plan_path)
    if logged.unrecorded:
        _warn_kept(tracking, logged)
    return logged


@task(name="start-run", cache_policy=NO_CACHE)
def start_run(tracking: Tracking, rec: RunRecord) -> Logged:
    return _record(tracking, rec)


@task(name="end-run", cache_policy=NO_CACHE)
def end_run(tracking: Tracking, rec: EndRecord) -> Logged:
    return _record(tracking, rec)


@contextmanager
def parent_run(tracking: Tracking, step: RunStep, inputs: Inputs, plan_id: str,
               params: dict[str, str] | None = None,
               tags: dict[str, str] | None = None) -> Iterator[ParentRun]:
    """A RUNNING pipeline/replan run for the block; FINISHED after it, FAILED with the cause in
    ``shardflow.error`` if it raises."""
    name = f"{step}-{Path(inputs.spec_path).stem}"
    rec = records.parent_record(step, name, plan_id, inputs, params or {}, {**_flow_run_tags(), **(tags or {})})
    run = ParentRun(rec.key, plan_id)
    start_run(tracking, rec)
    status, error = RunStatus.FAILED, None
    try:
        yield run
        status = RunStatus.FINISHED
    except BaseException as e:
        error = records.error_tag(e)
        raise
    finally:
        end_tags = {records.PLAN_ID: run.plan_id, **({records.ERROR: error} if error else {})}
        ended = end_run(tracking, EndRecord(run.key, status, records.now_ms(), end_tags, run.params,
                                            records.with_legacy_names(step, run.metrics)))
        run.run_id, run.pending, run.error, run.lost = ended.run_id, ended.pending, ended.error, ended.lost


@dataclass(frozen=True)
class LastPlanning:
    spec_hash: str
    plan_id: str
    run_id: str


@dataclass(frozen=True)
class PlanningLookup:
    """What ``find_last_planning`` found: the planning (None if none), or why MLflow could not say."""

    last: LastPlanning | None
    error: str | None = None  # MLflow unavailable: nothing was compared


@task(name="find-last-planning", cache_policy=NO_CACHE)
def find_last_planning(tracking: Tracking, inputs: Inputs) -> PlanningLookup:
    """The newest successful planning of this spec file on this topology; none if there is none
    or MLflow cannot be used (then replanning is the safe answer, and cheap when cached)."""
    try:
        client, experiment_id = connect(tracking)
        run = last_planning(client, experiment_id, inputs.spec_path, inputs.topology.topology_hash)
    except Exception as e:
        why = str(e) if isinstance(e, TrackingUnavailable) else tracking_failure(e)
        if why is None:
            raise
        get_run_logger().warning("%s: cannot compare with the last plan; replanning", unavailable(tracking, why),
                                 extra={TRACKING_WARNING: True})
        return PlanningLookup(None, unavailable(tracking, why))
    if run is None:
        return PlanningLookup(None)
    tags = run.data.tags
    return PlanningLookup(LastPlanning(tags[records.SPEC_HASH], tags[records.PLAN_ID], run.info.run_id))


fetch_plan_task = task(name="fetch-plan", cache_policy=NO_CACHE)(fetch_plan)  # for train_flow


@task(name="fetch-previous-plan", cache_policy=NO_CACHE)
def previous_plan_task(tracking: Tracking, plan_id: str) -> Plan | None:
    """The plan ``plan_id`` (from MLflow or the outbox), checked, to replan from; None, with a
    warning, when it cannot be had: the replan then starts from scratch."""
    import tempfile

    from rec.analysis import check_plan
    from rec.errors import InputError
    from rec.plan import read_plan

    with tempfile.TemporaryDirectory(prefix="shardflow-previous-") as tmp:
        try:
            plan = read_plan(fetch_plan(tracking, plan_id, tmp))
            check_plan(plan, source=f"the previous plan {plan_id}")
        except InputError as e:
            get_run_logger().warning("replanning from scratch: %s", e.render().replace("\n", " "))
            return None
    return plan
