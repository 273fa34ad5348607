"""``plan_flow``: steps 1-3 — ingest the spec, search a plan (cached by plan_id), write and log it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from prefect import flow

from rec.cost.types import CostConfig
from rec.search import SearchConfig
from tasks.artifact import write_plan_artifact
from tasks.ingest import ingest_spec
from tasks.mlflow_log import Logged, deliver_outbox, log_plan
from tasks.search import PlannerSettings, cached_search
from tasks.tracking import DEFAULT_EXPERIMENT, DEFAULT_STATE_DIR, tracking_for

Backend = Literal["local", "ray", "auto"]
DEFAULT_OUT = "out"


@dataclass(frozen=True)
class PlanOutcome:
    plan_id: str
    plan_path: str
    cached: bool  # the plan came from the cache: no search, no new MLflow plan run
    logged: Logged


@flow(name="shardflow-plan")
def plan_flow(
    spec_path: str,
    topology_path: str,
    backend: Backend = "local",
    groups: int | None = None,
    cost: CostConfig = CostConfig(),
    search: SearchConfig = SearchConfig(),
    out_dir: str = DEFAULT_OUT,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    state_dir: str = DEFAULT_STATE_DIR,
) -> PlanOutcome:
    """Plan ``spec_path`` for ``topology_path``; the plan goes to OUT_DIR/plan and to MLflow."""
    tracking = tracking_for(tracking_uri, experiment, state_dir)
    planner = PlannerSettings(backend, groups, cost, search)
    deliver_outbox(tracking)

    inputs = ingest_spec(spec_path, topology_path)
    found = cached_search(inputs, planner, state_dir)
    plan_path = write_plan_artifact(found.plan, str(Path(out_dir, "plan")))
    logged = log_plan(tracking, found.plan, plan_path, inputs)
    return PlanOutcome(found.plan.plan_id, plan_path, found.cached, logged)
