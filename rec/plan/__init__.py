"""Plans: the type, validation, plan.json/shards.parquet I/O and the plan_id.

``rec.plan.torchrec_plan`` converts to a torchrec ShardingPlan (imports torch).
"""

from rec.plan.build import build_plan, rows_per_rank
from rec.plan.io import PLAN_FILE, SHARDS_FILE, dumps_plan, read_plan, write_plan
from rec.plan.types import PLAN_FORMAT, Plan, PlanMetrics, Shard, TablePlan
from rec.plan.validate import validate_plan

__all__ = ["PLAN_FILE", "PLAN_FORMAT", "SHARDS_FILE", "Plan", "PlanMetrics", "Shard", "TablePlan",
           "build_plan", "dumps_plan", "read_plan", "rows_per_rank", "validate_plan", "write_plan"]
