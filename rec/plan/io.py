"""``plan.json`` and ``shards.parquet`` (docs/plan-format.md), by concern: the JSON text
(``rec.plan.plan_json``), reading it into a typed plan (``rec.plan.parse``), the Parquet files
(``rec.plan.shards_file``) and the plan directory written as a unit (``rec.plan.directory``). The
names are importable from here, as they always were."""

from __future__ import annotations

from rec.disk_full import DISK_FULL_ERRNOS
from rec.plan.directory import (
    PLAN_DIR_FILES,
    PLAN_FILES,
    TMP_PREFIX,
    WRITE_LOCK,
    plan_file,
    read_plan,
    write_plan,
    write_plan_files,
)
from rec.plan.parse import parse_plan, plan_from_dict
from rec.plan.plan_json import (
    KERNEL_VALUES,
    PLAN_FILE,
    SHARDING_VALUES,
    dumps_plan,
    metrics_to_dict,
    movement_to_dict,
    plan_to_dict,
    planner_to_dict,
    table_lines,
)
from rec.plan.shards_file import (
    MOVEMENT_FILE,
    ROWS_PER_GROUP,
    SHARD_COLUMNS,
    SHARD_COLUMNS_MODULES,
    SHARDS_FILE,
    TEXT_COLUMNS,
    shard_columns,
    shard_tables,
    shards_problems,
    write_movement,
    write_shards,
)

__all__ = [
    "DISK_FULL_ERRNOS", "KERNEL_VALUES", "MOVEMENT_FILE", "PLAN_DIR_FILES", "PLAN_FILE", "PLAN_FILES",
    "ROWS_PER_GROUP", "SHARDING_VALUES", "SHARDS_FILE", "SHARD_COLUMNS", "SHARD_COLUMNS_MODULES", "TEXT_COLUMNS",
    "TMP_PREFIX", "WRITE_LOCK", "dumps_plan", "metrics_to_dict", "movement_to_dict", "parse_plan", "plan_file",
    "plan_from_dict", "plan_to_dict", "planner_to_dict", "read_plan", "shard_columns", "shard_tables",
    "shards_problems", "table_lines", "write_movement", "write_plan", "write_plan_files", "write_shards",
]
