"""Plans: the typed value, validation, plan.json/shards.parquet I/O and the plan_id; ``check_plan`` is
what a plan read back must pass (``rec.plan.recompute`` recomputes its metrics from its shards).

``rec.plan.build`` turns a search result into a Plan (imports the search);
``rec.plan.torchrec_plan`` converts to a torchrec ShardingPlan (imports torch).
"""

from rec.plan.directory import PLAN_FILES, plan_file, read_plan, write_plan
from rec.plan.metrics import BoundMethod, Movement
from rec.plan.parse import parse_plan, plan_from_dict
from rec.plan.plan_json import PLAN_FILE, dumps_plan
from rec.plan.planner_identity import MadeBy, Planner, PlannerIdentity, SearchConfig
from rec.plan.shards_file import SHARDS_FILE
from rec.plan.types import PLAN_FORMAT, Plan, PlanMetrics, Shard, TablePlan
from rec.plan.validate import check_plan, validate_plan

__all__ = ["PLAN_FILE", "PLAN_FILES", "PLAN_FORMAT", "SHARDS_FILE", "BoundMethod", "MadeBy", "Movement", "Plan",
           "PlanMetrics", "Planner", "PlannerIdentity", "SearchConfig", "Shard", "TablePlan", "check_plan",
           "dumps_plan", "parse_plan", "plan_file", "plan_from_dict", "read_plan", "validate_plan", "write_plan"]
