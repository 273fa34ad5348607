"""Step 2, plan search (local or on Ray actors), cached by what is planned.

The cache key is the plan_id the inputs will produce (spec hash, topology hash, planner
configuration), computed before searching. Prefect keeps the cached plan under
``STATE_DIR/plan-cache``: an unchanged re-run, or a pipeline whose training is retried, gets the
plan back without searching again. For ``backend: ray|auto`` the key covers the backend and the
``groups`` asked for (``None``: chosen at run time from the cluster's CPUs), so it is not the
plan_id itself; for ``local`` it is.

The searcher also merges: Ray's driver merges the group results and rebalances across ranks
(``rec.search.merge``), and ``plan_spec`` builds and validates the global plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from prefect import task
from prefect.tasks import exponential_backoff

from rec.cost.types import CostConfig
from rec.hashing import content_hash
from rec.plan import Plan, PlanMetrics, Shard, TablePlan
from rec.plan.build import planner_config
from rec.plan.identity import plan_id
from rec.planning import plan_spec
from rec.search import SearchConfig
from tasks.ingest import Inputs
from tasks.retry import unless_input_error

PLAN_CACHE = "plan-cache"
# Cached plans are pickles: a change to the Plan types must not bring old objects back.
PLAN_SHAPE = content_hash([[f.name for f in fields(t)] for t in (Plan, PlanMetrics, TablePlan, Shard)])[:8]


@dataclass(frozen=True)
class PlannerSettings:
    """How to search: the backend and the configuration the plan_id covers."""

    backend: str = "local"  # local | ray | auto
    groups: int | None = None  # Ray table groups; None: from the table count and cluster CPUs
    cost: CostConfig = field(default_factory=CostConfig)
    search: SearchConfig = field(default_factory=SearchConfig)


@dataclass(frozen=True)
class Found:
    plan: Plan
    cached: bool  # True: Prefect's cache gave the plan back, nothing was searched


def plan_key(inputs: Inputs, planner: PlannerSettings) -> str:
    """The plan_id these inputs will get (local), or that of the request (ray/auto)."""
    request = {} if planner.backend == "local" else {"backend": planner.backend,
                                                      "groups": planner.groups}
    return plan_id(inputs.spec.spec_hash, inputs.topology.topology_hash,
                   {**planner_config(planner.cost, planner.search), **request})


def _cache_key(context: Any, parameters: dict[str, Any]) -> str:
    return f"shardflow-plan-{plan_key(parameters['inputs'], parameters['planner'])}-{PLAN_SHAPE}"


@task(name="search-plan", cache_key_fn=_cache_key, retries=2,
      retry_delay_seconds=exponential_backoff(backoff_factor=2), retry_condition_fn=unless_input_error)
def search_plan(inputs: Inputs, planner: PlannerSettings) -> Plan:
    """Search, merge and validate a plan; retried with backoff (a lost Ray cluster, a dead
    driver), but not for an InputError such as tables that fit no rank."""
    searcher = None
    if planner.backend != "local":
        from tasks.ray_search import searcher_for_backend

        searcher = searcher_for_backend(planner.backend, len(inputs.spec), planner.groups)
    return plan_spec(inputs.spec, inputs.topology, planner.cost, planner.search, searcher)


def cached_search(inputs: Inputs, planner: PlannerSettings, state_dir: str) -> Found:
    """Run ``search_plan`` with its cache under ``state_dir``; say whether the cache answered."""
    cache = Path(state_dir, PLAN_CACHE).resolve()
    state = search_plan.with_options(result_storage=cache)(inputs, planner, return_state=True)
    return Found(state.result(), cached=state.name == "Cached")
