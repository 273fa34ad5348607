"""The one-screen summary ``ShardflowPlanner(debug=True)`` logs: the per-rank table ``shardflow
plan`` prints (``rec.plan.report``), the plan's quality and how long planning took."""

from __future__ import annotations

from rec.analysis.plan_quality import quality_lines
from rec.plan.report import rank_table
from rec.plan.types import Plan
from rec.text_table import render_table


def plan_summary(plan: Plan, seconds: float, search_s: float) -> str:
    """The per-rank table, then tables by sharding type, critical path, bound and timing."""
    table = rank_table(plan)
    return "\n".join([
        f"shardflow planned {len(plan.tables):,} tables on {plan.world_size:,} {plan.topology.compute_device.value} "
        f"ranks in {seconds:.2f} s (search {search_s:.2f} s)",
        render_table(table.header, table.rows, right=table.right),
        *([table.note] if table.note else []),
        *quality_lines(plan),
        f"plan_id:       {plan.plan_id}",
    ])
