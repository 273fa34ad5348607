"""``plan_id``: the same spec, topology and planner configuration give the same id.

The id is computed before searching (it keys the plan cache) and again from a plan's own content
when the plan is read back (``identity_problems``), so an edited plan.json is caught."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rec.errors import InputError, Problem
from rec.hashing import content_hash

if TYPE_CHECKING:
    from rec.cost.types import CostConfig
    from rec.plan.types import Plan
    from rec.search.config import SearchConfig

# Part of every plan_id: fixed, so that a new plan.json format keeps the ids of old plans.
PLAN_ID_FORMAT = "shardflow.plan/v1"


def planner_config(cost: CostConfig, search: SearchConfig,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The planner configuration a plan_id covers; ``extra`` is what the searcher adds (e.g. the
    Ray backend and its groups)."""
    c = asdict(cost)
    c["optimizer"] = cost.optimizer.value
    return {"cost": c, "search": asdict(search), **(extra or {})}


def plan_id(spec_hash: str, topology_hash: str, planner: dict[str, Any]) -> str:
    """The one formula for plan ids."""
    return content_hash({"format": PLAN_ID_FORMAT, "spec": spec_hash, "topology": topology_hash,
                         "planner": planner})


def identity_problems(plan: Plan) -> list[Problem]:
    """Problems if the plan's spec rows, topology or planner do not give its spec_hash and plan_id."""
    from rec.spec.hashing import rows_hash
    from rec.topology import topology_from_dict

    where = f"plan {plan.plan_id}"
    try:
        topology = topology_from_dict(plan.topology, source="in the plan")
        spec_hash = rows_hash(plan.spec_tables)
    except (InputError, TypeError, ValueError) as e:
        return [Problem(where, f"carries an invalid topology or spec: {e}")]
    problems = []
    if spec_hash != plan.spec_hash:
        problems.append(Problem(where, f"its spec rows hash to {spec_hash}, not its spec_hash "
                                       f"{plan.spec_hash}: the plan was edited"))
    expected = plan_id(plan.spec_hash, topology.topology_hash, plan.planner)
    if expected != plan.plan_id:
        problems.append(Problem(where, f"its content gives plan_id {expected}: the plan (spec, "
                                       "topology or planner) was edited after planning; replan"))
    return problems
