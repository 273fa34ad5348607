"""``replan_flow``: replan a spec file only when its schema changed (the cron deployment).

It hashes the spec and compares the hash with the newest successful planning of the same spec
file on the same topology in MLflow. Same hash: a small ``shardflow.step=replan`` run tagged
``shardflow.replan=unchanged`` records the check. Different hash (or no earlier planning): a replan
run tagged ``replanned`` with the new plan run nested under it. Replan runs carry the spec hash
too, so a spec changed A -> B -> A is compared with the last check, not an older plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from prefect import flow

from flows.plan import DEFAULT_OUT, Backend
from rec.cost.types import CostConfig
from rec.search import SearchConfig
from tasks.artifact import write_plan_artifact
from tasks.ingest import ingest_spec
from tasks.mlflow_log import (deliver_outbox, find_last_planning, log_plan, parent_run,
                              record_unchanged)
from tasks.records import REPLAN
from tasks.search import PlannerSettings, cached_search, plan_key
from tasks.tracking import DEFAULT_EXPERIMENT, DEFAULT_STATE_DIR, tracking_for


@dataclass(frozen=True)
class ReplanOutcome:
    outcome: Literal["unchanged", "replanned"]
    plan_id: str
    spec_hash: str
    previous_spec_hash: str | None
    plan_path: str | None  # None when unchanged: nothing was written


@flow(name="shardflow-replan")
def replan_flow(
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
) -> ReplanOutcome:
    """Replan ``spec_path`` if its spec hash differs from the last successful planning of it."""
    tracking = tracking_for(tracking_uri, experiment, state_dir)
    planner = PlannerSettings(backend, groups, cost, search)
    deliver_outbox(tracking)

    inputs = ingest_spec(spec_path, topology_path)
    spec_hash = inputs.spec.spec_hash
    last = find_last_planning(tracking, inputs)
    if last is not None and last.spec_hash == spec_hash:
        record_unchanged(tracking, inputs, last.plan_id)
        return ReplanOutcome("unchanged", last.plan_id, spec_hash, last.spec_hash, None)

    with parent_run(tracking, "replan", inputs, plan_key(inputs, planner),
                    tags={REPLAN: "replanned"}) as run:
        found = cached_search(inputs, planner, state_dir)
        plan_path = write_plan_artifact(found.plan, str(Path(out_dir, "plan")))
        run.plan_id = found.plan.plan_id
        log_plan(tracking, found.plan, plan_path, inputs, run)
    return ReplanOutcome("replanned", found.plan.plan_id, spec_hash,
                         last.spec_hash if last else None, plan_path)
