"""Edits of a plan.json payload that the plan checks must tell apart: a table moved with its
metrics left alone (refused everywhere), and every table on rank 0 with metrics made to match
(a sound, true plan: only the plan cache refuses it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rec.analysis.recompute import recompute
from rec.plan import Plan
from rec.plan.chart import CHART_FILE, rank_load_chart
from rec.plan.io import plan_from_dict
from rec.search.exact import OPTIMALITY_TOLERANCE


def chart_of(plan: Plan) -> Callable[[Path], None]:
    """``write_plan``'s ``extra`` that adds the plan's chart, as the write step does."""

    def draw(tmp: Path) -> None:
        rank_load_chart(plan, tmp / CHART_FILE)

    return draw


def move_first_table(d: dict) -> dict:
    """One table's shard on the other rank; metrics left as they were."""
    t = next(t for t in d["tables"] if not t.get("replicated"))
    t["shards"][0]["rank"] = t["ranks"][0] = 1 - t["shards"][0]["rank"]
    return d


def all_on_rank_0(d: dict) -> dict:
    """Every shard on rank 0 and the metrics made to match: a sound plan, true to its shards."""
    for t in d["tables"]:
        if not t.get("replicated"):
            for s in t["shards"]:
                s["rank"] = 0
            t["ranks"] = [0] * len(t["shards"])
    est = recompute(plan_from_dict(d))
    m = d["metrics"]
    m.update(rank_perf=est.rank_perf.tolist(), rank_hbm=[int(x) for x in est.rank_hbm],
             rank_ddr=[int(x) for x in est.rank_ddr], critical_path=est.critical_path)
    m["gap"] = m["critical_path"] / m["lower_bound"] - 1
    m["optimal"] = m["critical_path"] <= m["lower_bound"] * (1 + OPTIMALITY_TOLERANCE)
    return d
