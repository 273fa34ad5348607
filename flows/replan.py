"""``replan_flow``: replan a spec file only when its schema changed (the cron deployment).

It hashes the spec and compares the hash with the newest successful planning of the same spec
file on the same topology in MLflow. Same hash: nothing is recorded in MLflow — the check is the
flow run itself, in Prefect's run history, its log ending with the line the CLI prints. Different
hash (or no earlier planning): a replan run tagged ``shardflow.replan=replanned`` with the new plan
run nested under it. Replan runs carry the spec hash too, so a spec changed A -> B -> A is
compared with the last planning (B), not an older plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from prefect import flow, get_run_logger

from flows.start import Ingested, Started, inputs_for, started
from rec.file_lock import file_lock
from rec.hashing import content_hash
from tasks.ingest import Inputs
from tasks.mlflow_log import find_last_planning, log_plan, parent_run, previous_plan_task
from tasks.records import PREVIOUS_PLAN_ID, REPLAN, RunStep
from tasks.run_dirs import RunDirs
from tasks.search import SearchSettings, plan_key, with_profile
from tasks.steps import search_task, write_task
from tasks.tracking import TrackingSettings
from tasks.write import WriteSettings


class Replan(StrEnum):
    """What a replan did: its outcome, and the ``shardflow.replan`` tag of a replan run."""

    UNCHANGED = "unchanged"  # the spec hash was planned last: nothing done
    REPLANNED = "replanned"


@dataclass(frozen=True)
class ReplanOutcome:
    outcome: Replan
    plan_id: str
    spec_hash: str
    previous_spec_hash: str | None
    plan_path: str | None  # None when unchanged: nothing was written
    pending: int = 0  # records of this replan kept in the outbox (MLflow unavailable)
    tracking_error: str | None = None  # why, in one line
    compared: bool = True  # False: MLflow could not tell the last planning; replanned to be safe

    def summary(self) -> str:
        """The one line the CLI prints and the flow run's log ends with."""
        if self.outcome is Replan.UNCHANGED:
            return (f"{self.outcome}: spec hash {self.spec_hash} was last planned as plan {self.plan_id}; "
                    "nothing replanned")
        before = (f" (was {self.previous_spec_hash})" if self.previous_spec_hash else
                  " (first plan)" if self.compared else " (not compared: MLflow unavailable)")
        return f"{self.outcome}: spec hash {self.spec_hash}{before} -> plan {self.plan_id} in {self.plan_path}"


@flow(name="shardflow-replan")
def replan_flow(
    spec_path: str,
    topology_path: str,
    searching: SearchSettings = SearchSettings(),
    chart: bool = WriteSettings.chart,
    out_dir: str | None = None,
    tracking: TrackingSettings = TrackingSettings(),
    work_dir: str | None = None,
    ingested: Ingested | None = None,
) -> ReplanOutcome:
    """Replan ``spec_path`` if its spec hash differs from the last successful planning of it; the
    new plan starts from that planning's plan and moves as little of it as
    ``searching.max_regress`` allows."""
    searching = with_profile(searching)

    with started(tracking, work_dir) as start:
        inputs = inputs_for(spec_path, topology_path, ingested)
        with _one_replan_at_a_time(start, inputs):
            outcome = _replanned(start, inputs, searching, chart, out_dir, work_dir)
    get_run_logger().info(outcome.summary())
    return outcome


@contextmanager
def _one_replan_at_a_time(start: Started, inputs: Inputs) -> Iterator[None]:
    """Hold the replan lock of this spec file, topology and store in the state directory: two
    replans at once (a schedule's and one by hand) both found the spec changed and both recorded a
    replan. The second now waits, then finds the first's planning."""
    key = content_hash({"store": start.tracking.uri, "experiment": start.tracking.experiment,
                        "spec": str(Path(inputs.spec_path).resolve()), "topology": inputs.topology.topology_hash})
    Path(start.state_dir).mkdir(parents=True, exist_ok=True)
    path = Path(start.state_dir) / f"replan-{key}.lock"
    with ExitStack() as held:
        try:
            held.enter_context(file_lock(path, blocking=False, removed=True))
        except BlockingIOError:
            get_run_logger().info("waiting for another replan of %s on this topology to finish", inputs.spec_path)
            held.enter_context(file_lock(path, removed=True))
        yield


def _replanned(start: Started, inputs: Inputs, searching: SearchSettings, chart: bool, out_dir: str | None,
               work_dir: str | None) -> ReplanOutcome:
    """The replan itself: nothing when the spec hash is the last planning's, else a plan from it."""
    spec_hash = inputs.spec.spec_hash
    lookup = find_last_planning(start.tracking, inputs)
    last = lookup.last
    if last is not None and last.spec_hash == spec_hash:
        outcome = ReplanOutcome(Replan.UNCHANGED, last.plan_id, spec_hash, last.spec_hash, None,
                                start.delivery.pending_for(start.tracking),
                                start.delivery.errors.get(start.tracking.uri))
    else:
        previous = previous_plan_task(start.tracking, last.plan_id) if last is not None else None
        with parent_run(start.tracking, RunStep.REPLAN, inputs, plan_key(inputs, searching, previous),
                        tags={REPLAN: Replan.REPLANNED,
                              **({PREVIOUS_PLAN_ID: previous.plan_id} if previous else {})}) as run:
            found = search_task(inputs, searching, start.plan_cache_dir, previous)
            written = write_task(found.plan, RunDirs.of(out_dir, work_dir).plan_dir(found.plan.plan_id),
                                 WriteSettings(chart))
            run.add_plan(found.plan)
            log_plan(start.tracking, found.plan, written.plan_path, inputs, run, found.seconds)
        outcome = ReplanOutcome(Replan.REPLANNED, found.plan.plan_id, spec_hash,
                                last.spec_hash if last else None, written.plan_path, run.pending,
                                run.error or lookup.error, lookup.error is None)
    return outcome
