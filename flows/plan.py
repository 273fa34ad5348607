"""``plan_flow``: steps 1-3 — ingest the spec, search a plan (cached by plan_id), write and log it."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow, get_run_logger

from flows.parameters import search_settings
from flows.progress import progress_in_run_log
from rec.cost.types import CostConfig
from rec.search import SearchConfig
from tasks.backend import Backend
from tasks.ingest import IngestSettings
from tasks.mlflow_log import Logged, deliver_outbox, log_plan
from tasks.paths import plan_cache_dir, state_dir_in
from tasks.run_dirs import RunDirs
from tasks.search import SearchSettings
from tasks.steps import ingest_task, search_task, write_task
from tasks.tracking import DEFAULT_EXPERIMENT, tracking_for
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
    profile_path: str | None = None,
    backend: Backend = SearchSettings.backend,
    groups: int | None = SearchSettings.groups,
    max_regress: float = SearchSettings.max_regress,
    cost: CostConfig = CostConfig(),
    search: SearchConfig = SearchConfig(),
    chart: bool = WriteSettings.chart,
    out_dir: str | None = None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    state_dir: str | None = None,
    work_dir: str | None = None,
) -> PlanOutcome:
    """Plan ``spec_path`` for ``topology_path``; the plan goes to OUT_DIR/plan (default:
    out/<plan_id>/plan) and to MLflow."""
    searching = search_settings(backend=backend, groups=groups, max_regress=max_regress, cost=cost, search=search,
                                profile_path=profile_path)
    dirs = RunDirs.of(out_dir, work_dir)
    state_dir = state_dir_in(work_dir, state_dir)
    tracking = tracking_for(tracking_uri, experiment, state_dir, work_dir)
    deliver_outbox(tracking)

    with progress_in_run_log():
        inputs = ingest_task(spec_path, topology_path, IngestSettings())
        found = search_task(inputs, searching, plan_cache_dir(state_dir))
        written = write_task(found.plan, dirs.plan_dir(found.plan.plan_id), WriteSettings(chart))
        logged = log_plan(tracking, found.plan, written.plan_path, inputs, planning_s=found.seconds)
    outcome = PlanOutcome(found.plan.plan_id, written.plan_path, found.cached, logged)
    get_run_logger().info(outcome.summary())
    return outcome
