"""What a plan read back must pass before anything uses it: sound (``rec.plan.validate_plan``),
unedited (its spec, topology, profile and planner still give its plan_id), its profile measured on
its kind of device, and its metrics what its shards give (``rec.analysis.recompute``, which needs
the cost model and the search's bound: so this sits above the plan value and the search)."""

from __future__ import annotations

from rec.analysis.recompute import metrics_problems
from rec.plan.plan_id import identity_problems
from rec.plan.types import Plan
from rec.plan.validate import validate_plan
from rec.profile.validate import profile_problems_for
from rec.validation import Problems


def check_plan(plan: Plan, source: str | None = None, earlier_cost_models: bool = True) -> None:
    """InputError naming every problem if ``plan`` is unsound, was edited after planning, or claims
    metrics its shards do not give (``rec.analysis.recompute``): what a plan read back (handed to
    training, replanned from, read from the cache or MLflow) must pass. ``earlier_cost_models``
    False: its metrics must be today's cost model's (the plan cache, which searches again where
    they are not)."""
    problems = validate_plan(plan)
    problems.items += identity_problems(plan)
    profile_problems_for(plan.planner.profile, plan.topology, Problems(items=problems.items).within("planner.profile"))
    if not problems:  # the estimates need a sound plan of its own spec and topology
        problems.items += metrics_problems(plan, earlier_cost_models)
    problems.raise_if_any(f"{source or 'plan ' + plan.plan_id} cannot be used:")

