"""Plans: the type, validation, plan.json/shards.parquet I/O and the plan_id; ``check_plan`` is
what a plan read back must pass (``rec.plan.recompute`` recomputes its metrics from its shards).

``rec.plan.build`` turns a search result into a Plan (imports the search);
``rec.plan.torchrec_plan`` converts to a torchrec ShardingPlan (imports torch).
"""

from rec.plan.io import PLAN_FILE, PLAN_FILES, SHARDS_FILE, dumps_plan, plan_file, read_plan, write_plan
from rec.plan.types import PLAN_FORMAT, Plan, PlanMetrics, Shard, TablePlan
from rec.plan.validate import check_plan, validate_plan

__all__ = ["PLAN_FILE", "PLAN_FILES", "PLAN_FORMAT", "SHARDS_FILE", "Plan", "PlanMetrics", "Shard", "TablePlan",
           "check_plan", "dumps_plan", "plan_file", "read_plan", "validate_plan", "write_plan"]
