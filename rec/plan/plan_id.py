"""``plan_id``: the same spec, topology and planner configuration give the same id.

The id is computed before searching (it keys the plan cache) and again from a plan's own content
when the plan is read back (``identity_problems``), so an edited plan.json is caught."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from rec.config.cost import CostConfig
from rec.config.planner_identity import MadeBy, Planner, PlannerIdentity
from rec.config.search import SearchConfig
from rec.errors import Problem
from rec.hashing import content_hash
from rec.profile import Profile

if TYPE_CHECKING:
    from rec.plan.types import Plan

# Part of every plan_id: fixed, so that a new plan.json format keeps the ids of old plans.
PLAN_ID_FORMAT = "shardflow.plan/v1"
# A plan made by another planner than shardflow's search names it here (``made_by_keys``); shardflow's
# own plans have no such key, so their plans and plan_ids are what they were.
MADE_BY = "made_by"
# Measured, so left out of the plan_id: the same inputs give the same id however long planning took.
MADE_BY_SECONDS = "seconds"


def planner_config(cost: CostConfig, search: SearchConfig,
                   extra: PlannerIdentity | None = None) -> PlannerIdentity:
    """The planner configuration a plan_id covers: ``cost`` (its profile included: a profile other
    than the default enters the plan_id, the default leaves plans and plan_ids as they were) and
    ``search``, with what ``extra`` adds (how the search ran, a replan: ``searcher_keys``,
    ``replan_keys``)."""
    base = extra or PlannerIdentity()
    return replace(base, cost=cost, search=search)


def searcher_keys(backend: str, groups: int | None) -> PlannerIdentity:
    """What searching on ``backend`` (not the local search) in ``groups`` table groups adds to the
    planner configuration; None groups: to be chosen when searching (a request's key)."""
    return PlannerIdentity(backend=backend, groups=groups)


def made_by_keys(name: Planner, torchrec: str, proposers: tuple[str, ...], seconds: float) -> MadeBy:
    """What a plan made by the planner ``name`` (e.g. TorchRec's) records: TorchRec's version, the
    proposers, and how long it planned, in seconds (to the millisecond)."""
    return MadeBy(name, torchrec, proposers, round(seconds, 3))


def made_by(plan: Plan) -> str:
    """The planner that made ``plan``: ``shardflow`` unless its planner configuration names another."""
    return plan.planner.planner.value


def replan_keys(previous: Plan, max_regress: float, extra: PlannerIdentity | None = None) -> PlannerIdentity:
    """What replanning from ``previous`` within ``max_regress`` adds to the planner configuration
    (to ``extra``'s, e.g. how the search ran)."""
    return replace(extra or PlannerIdentity(), previous_plan_id=previous.plan_id, max_regress=max_regress)


def plan_profile(plan: Plan) -> Profile:
    """The profile a plan was made under (the default when it records none)."""
    return plan.planner.profile


def plan_id(spec_hash: str, topology_hash: str, planner: PlannerIdentity) -> str:
    """The one formula for plan ids (a ``made_by`` block's measured seconds left out)."""
    from rec.plan.plan_json import planner_to_dict

    covered = planner_to_dict(planner)
    if MADE_BY in covered:
        covered[MADE_BY] = {k: v for k, v in covered[MADE_BY].items() if k != MADE_BY_SECONDS}
    return content_hash({"format": PLAN_ID_FORMAT, "spec": spec_hash, "topology": topology_hash,
                         "planner": covered})


def identity_problems(plan: Plan) -> list[Problem]:
    """Problems if the plan's spec or its topology and planner do not give its spec_hash and plan_id."""
    where = f"plan {plan.plan_id}"
    problems = []
    if plan.spec.spec_hash != plan.spec_hash:
        problems.append(Problem(where, f"its spec rows hash to {plan.spec.spec_hash}, not its spec_hash "
                                       f"{plan.spec_hash}: the plan was edited"))
    expected = plan_id(plan.spec_hash, plan.topology.topology_hash, plan.planner)
    if expected != plan.plan_id:
        problems.append(Problem(where, f"its content gives plan_id {expected}: the plan (spec, "
                                       "topology or planner) was edited after planning; replan"))
    return problems
