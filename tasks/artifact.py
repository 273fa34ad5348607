"""Step 3, the plan artifact: validate the merged plan and write plan.json, shards.parquet and
the per-rank chart."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rec.plan import Plan, validate_plan, write_plan
from tasks.charts import rank_load_chart

CHART_FILE = "rank_load.png"


@task(name="write-plan", cache_policy=NO_CACHE)
def write_plan_artifact(plan: Plan, out_dir: str) -> str:
    """Validate again (a cached plan is checked like a fresh one), then write atomically;
    returns the path of plan.json."""
    problems = validate_plan(plan)
    if problems:
        raise AssertionError(f"plan {plan.plan_id} is invalid (a bug): {problems.items[:5]}")
    path = write_plan(plan, out_dir)
    rank_load_chart(plan, Path(out_dir) / CHART_FILE)
    return str(path)
