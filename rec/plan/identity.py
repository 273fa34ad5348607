"""``plan_id``: the same spec, topology and planner configuration give the same id.

The id is computed before searching (it keys the plan cache) and again from a plan's own content
when the plan is read back (``identity_problems``), so an edited plan.json is caught."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from rec.errors import InputError, Problem
from rec.hashing import content_hash
from rec.profile import DEFAULT_PROFILE, Profile, profile_from_record, profile_record

if TYPE_CHECKING:
    from rec.cost.types import CostConfig
    from rec.plan.types import Plan
    from rec.search.config import SearchConfig

# Part of every plan_id: fixed, so that a new plan.json format keeps the ids of old plans.
PLAN_ID_FORMAT = "shardflow.plan/v1"
# What a searcher other than the local one adds to the planner configuration (``searcher_keys``).
SEARCHER_KEYS = ("backend", "groups")
# A plan made by another planner than shardflow's search names it here (``made_by_keys``); shardflow's
# own plans have no such key, so their plans and plan_ids are what they were.
MADE_BY = "made_by"
# Measured, so left out of the plan_id: the same inputs give the same id however long planning took.
MADE_BY_SECONDS = "seconds"


def planner_config(cost: CostConfig, search: SearchConfig,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The planner configuration a plan_id covers; ``extra`` is what the searcher and a replan
    add (``searcher_keys``, ``replan_keys``). A profile other than the default adds ``profile``
    (its hash and content, ``rec.profile.profile_record``): the default leaves plans and plan_ids
    as they were."""
    c = {f.name: getattr(cost, f.name) for f in fields(cost) if f.name != "profile"}
    c["optimizer"] = cost.optimizer.value
    planner = {"cost": c, "search": asdict(search), **(extra or {})}
    if not cost.profile.is_default:
        planner["profile"] = profile_record(cost.profile)
    return planner


def searcher_keys(backend: str, groups: int | None) -> dict[str, Any]:
    """What searching on ``backend`` (not the local search) in ``groups`` table groups adds to the
    planner configuration; None groups: to be chosen when searching (a request's key)."""
    return dict(zip(SEARCHER_KEYS, (backend, groups), strict=True))


def made_by_keys(name: str, details: dict[str, Any], seconds: float) -> dict[str, Any]:
    """What a plan made by the planner ``name`` (e.g. ``torchrec``) adds to the planner configuration:
    ``details`` (versions, proposers) and how long it planned, in seconds."""
    return {MADE_BY: {"name": name, **details, MADE_BY_SECONDS: round(seconds, 3)}}


def made_by(plan: Plan) -> str:
    """The planner that made ``plan``: ``shardflow`` unless its planner configuration names another."""
    other = plan.planner.get(MADE_BY)
    return str(other.get("name")) if isinstance(other, dict) else "shardflow"


def replan_keys(previous: Plan, max_regress: float) -> dict[str, Any]:
    """What replanning from ``previous`` within ``max_regress`` adds to the planner configuration."""
    return {"previous_plan_id": previous.plan_id, "max_regress": max_regress}


def plan_profile(plan: Plan) -> Profile:
    """The profile a plan was made under (the default when it records none); InputError if its
    record is invalid or was edited."""
    record = plan.planner.get("profile")
    if record is None:
        return DEFAULT_PROFILE
    return profile_from_record(record, f"of plan {plan.plan_id}")


def plan_id(spec_hash: str, topology_hash: str, planner: dict[str, Any]) -> str:
    """The one formula for plan ids (a ``made_by`` block's measured seconds left out)."""
    other = planner.get(MADE_BY)
    if isinstance(other, dict) and MADE_BY_SECONDS in other:
        planner = {**planner, MADE_BY: {k: v for k, v in other.items() if k != MADE_BY_SECONDS}}
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
    try:
        plan_profile(plan)
    except InputError as e:
        return [Problem(where, f"carries an invalid profile: {'; '.join(str(p) for p in e.problems)}")]
    problems = []
    if spec_hash != plan.spec_hash:
        problems.append(Problem(where, f"its spec rows hash to {spec_hash}, not its spec_hash "
                                       f"{plan.spec_hash}: the plan was edited"))
    expected = plan_id(plan.spec_hash, topology.topology_hash, plan.planner)
    if expected != plan.plan_id:
        problems.append(Problem(where, f"its content gives plan_id {expected}: the plan (spec, "
                                       "topology or planner) was edited after planning; replan"))
    return problems
