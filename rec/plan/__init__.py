"""Plans: the typed value, its structural validation, plan.json/shards.parquet I/O and the plan_id.
What needs the cost model or the search beside the plan — building one from a search result,
checking one read back (``rec.analysis.check_plan``), predicting its time — is ``rec.analysis``;
``rec.plan.torchrec_plan`` converts to a torchrec ShardingPlan (imports torch). What made a plan
(``PlannerIdentity``) and the settings it records are ``rec.config``, below this package.
"""

from rec.plan.directory import PLAN_FILES, plan_file, read_plan, write_plan
from rec.plan.metrics import BoundMethod, Movement
from rec.plan.parse import parse_plan, plan_from_dict
from rec.plan.plan_json import PLAN_FILE, dumps_plan
from rec.plan.shards_file import SHARDS_FILE
from rec.plan.types import PLAN_FORMAT, Plan, PlanMetrics, Shard, TablePlan
from rec.plan.validate import validate_plan

__all__ = ["PLAN_FILE", "PLAN_FILES", "PLAN_FORMAT", "SHARDS_FILE", "BoundMethod", "Movement", "Plan", "PlanMetrics",
           "Shard", "TablePlan", "dumps_plan", "parse_plan", "plan_file", "plan_from_dict", "read_plan",
           "validate_plan", "write_plan"]
