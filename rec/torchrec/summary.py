"""The one-screen summary ``ShardflowPlanner(debug=True)`` logs: the per-rank table ``shardflow
plan`` prints (``rec.plan.report``), the plan's quality and how long planning took."""

from __future__ import annotations

from rec.analysis.iteration_time import cost_model_label, prediction
from rec.plan.report import rank_table, sharding_types
from rec.plan.types import Plan


def plan_summary(plan: Plan, seconds: float, search_s: float) -> str:
    """The per-rank table, then tables by sharding type, critical path, bound and timing."""
    m = plan.metrics
    table = rank_table(plan)
    widths = [max(len(row[i]) for row in (table.header, *table.rows)) for i in range(len(table.header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if h in table.right else c.ljust(w)
                         for c, w, h in zip(cells, widths, table.header, strict=True)).rstrip()

    rule = "  ".join(("-" if h else " ") * w for w, h in zip(widths, table.header, strict=True))  # none: a marker
    kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(sharding_types(plan).items()))
    optimal = "; proven optimal" if m.optimal else ""
    return "\n".join([
        f"shardflow planned {len(plan.tables):,} tables on {plan.world_size:,} {plan.topology.compute_device.value} "
        f"ranks in {seconds:.2f} s (search {search_s:.2f} s)",
        line(table.header), rule.rstrip(), *map(line, table.rows),
        *([table.note] if table.note else []),
        f"tables:        {len(plan.tables):,} ({kinds})",
        f"critical path: {m.critical_path:.4f} ms ({cost_model_label(plan)})",
        f"lower bound:   {m.lower_bound:.4f} ms  gap {100 * m.gap:.2f}% ({m.bound_method} bound{optimal})",
        f"predicted:     {prediction(plan).text()}",
        f"plan_id:       {plan.plan_id}",
    ])
