"""``replan_flow``: replan a spec file only when its schema changed (the cron deployment).

It hashes the spec and compares the hash with the newest successful planning of the same spec
file on the same topology in MLflow. Same hash: a small ``shardflow.step=replan`` run tagged
``shardflow.replan=unchanged`` records the check. Different hash (or no earlier planning): a replan
run tagged ``replanned`` with the new plan run nested under it. Replan runs carry the spec hash
too, so a spec changed A -> B -> A is compared with the last check, not an older plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prefect import flow

from flows.parameters import search_settings
from flows.progress import progress_in_run_log
from rec.cost.types import CostConfig
from rec.search import SearchConfig
from tasks.mlflow_log import (
    deliver_outbox,
    find_last_planning,
    log_plan,
    parent_run,
    previous_plan_task,
    record_unchanged,
)
from tasks.paths import DEFAULT_STATE_DIR, plan_cache_dir
from tasks.records import PREVIOUS_PLAN_ID, REPLAN
from tasks.run_dirs import RunDirs
from tasks.search import Backend, SearchSettings, plan_key
from tasks.steps import ingest_task, search_task, write_task
from tasks.tracking import DEFAULT_EXPERIMENT, tracking_for
from tasks.write import WriteSettings


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
    backend: Backend = SearchSettings.backend,
    groups: int | None = SearchSettings.groups,
    max_regress: float = SearchSettings.max_regress,
    cost: CostConfig = CostConfig(),
    search: SearchConfig = SearchConfig(),
    chart: bool = WriteSettings.chart,
    out_dir: str | None = None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    state_dir: str = DEFAULT_STATE_DIR,
) -> ReplanOutcome:
    """Replan ``spec_path`` if its spec hash differs from the last successful planning of it; the
    new plan starts from that planning's plan and moves as little of it as ``max_regress`` allows."""
    searching = search_settings(locals())
    tracking = tracking_for(tracking_uri, experiment, state_dir)
    deliver_outbox(tracking)

    with progress_in_run_log():
        inputs = ingest_task(spec_path, topology_path)
        spec_hash = inputs.spec.spec_hash
        last = find_last_planning(tracking, inputs)
        if last is not None and last.spec_hash == spec_hash:
            record_unchanged(tracking, inputs, last.plan_id)
            return ReplanOutcome("unchanged", last.plan_id, spec_hash, last.spec_hash, None)

        previous = previous_plan_task(tracking, last.plan_id) if last is not None else None
        with parent_run(tracking, "replan", inputs, plan_key(inputs, searching, previous),
                        tags={REPLAN: "replanned",
                              **({PREVIOUS_PLAN_ID: previous.plan_id} if previous else {})}) as run:
            found = search_task(inputs, searching, plan_cache_dir(state_dir), previous)
            written = write_task(found.plan, RunDirs.of(out_dir).plan_dir(found.plan.plan_id),
                                 WriteSettings(chart))
            run.plan_id = found.plan.plan_id
            log_plan(tracking, found.plan, written.plan_path, inputs, run, found.seconds)
    return ReplanOutcome("replanned", found.plan.plan_id, spec_hash,
                         last.spec_hash if last else None, written.plan_path)
