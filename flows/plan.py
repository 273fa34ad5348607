"""``plan_flow``: steps 1-3 — ingest the spec, search a plan (cached by plan_id), write and log it."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow, get_run_logger

from flows.start import Ingested, inputs_for, started
from tasks.mlflow_log import Logged, log_plan
from tasks.run_dirs import RunDirs
from tasks.search import SearchSettings, with_profile
from tasks.steps import search_task, write_task
from tasks.tracking import TrackingSettings
from tasks.write import WriteSettings


def plan_summary(plan_path: str, plan_id: str, cached: bool) -> str:
    """The line that says which plan a flow found, and whether it was searched."""
    how = "from the cache, not searched again" if cached else "searched"
    return f"plan      {plan_path}  (plan_id {plan_id}, {how})"


@dataclass(frozen=True)
class PlanOutcome:
    plan_id: str
    plan_path: str
    cached: bool  # the plan came from the cache: no search, no new MLflow plan run
    logged: Logged

    def summary(self) -> str:
        """The line ``shardflow run --plan-only`` prints first and the flow run's log ends with."""
        return plan_summary(self.plan_path, self.plan_id, self.cached)


@flow(name="shardflow-plan")
def plan_flow(
    spec_path: str,
    topology_path: str,
    searching: SearchSettings = SearchSettings(),
    chart: bool = WriteSettings.chart,
    out_dir: str | None = None,
    tracking: TrackingSettings = TrackingSettings(),
    work_dir: str | None = None,
    ingested: Ingested | None = None,
) -> PlanOutcome:
    """Plan ``spec_path`` for ``topology_path`` as ``searching`` says; the plan goes to
    OUT_DIR/plan (default: out/<plan_id>/plan) and to MLflow."""
    searching = with_profile(searching)
    dirs = RunDirs.of(out_dir, work_dir)

    # An --out a run holds is refused: its plan would replace the one the run is training
    with started(tracking, work_dir) as start, dirs.locked():
        inputs = inputs_for(spec_path, topology_path, ingested)
        found = search_task(inputs, searching, start.plan_cache_dir)
        written = write_task(found.plan, dirs.plan_dir(found.plan.plan_id), WriteSettings(chart))
        logged = log_plan(start.tracking, found.plan, written.plan_path, inputs, planning_s=found.seconds)
    outcome = PlanOutcome(found.plan.plan_id, written.plan_path, found.cached, logged)
    get_run_logger().info(outcome.summary())
    return outcome
