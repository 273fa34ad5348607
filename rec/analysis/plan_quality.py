"""A plan's quality as the plan reports print it (``shardflow plan`` and the drop-in planner's
summary): its tables by sharding type, critical path (and the cost model it is counted in), lower
bound and gap, and predicted iteration time."""

from __future__ import annotations

from rec.analysis.iteration_time import cost_model_label, prediction
from rec.plan.metrics import shown_gap
from rec.plan.report import sharding_types
from rec.plan.types import Plan


def quality_lines(plan: Plan) -> list[str]:
    """``tables:``, ``critical path:``, ``lower bound:`` and ``predicted:``, one line each."""
    m = plan.metrics
    kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(sharding_types(plan).items()))
    optimal = "; proven optimal" if m.optimal else ""
    return [
        f"tables:        {len(plan.tables):,} ({kinds})",
        f"critical path: {m.critical_path:.4f} ms ({cost_model_label(plan)})",
        f"lower bound:   {m.lower_bound:.4f} ms  gap {100 * shown_gap(m.gap):.2f}% ({m.bound_method} bound{optimal})",
        f"predicted:     {prediction(plan).text()}",
    ]
