"""Plan analysis: what needs the plan value together with the cost model and the search, above all
three — a plan built from a search result (``build``), a plan read back checked and its metrics
recomputed (``check``, ``recompute``), a plan's predicted time under any profile (``predict``,
``prediction``). ``rec.plan`` holds the value itself and imports none of this."""

from rec.analysis.build import build_plan
from rec.analysis.check import check_plan

__all__ = ["build_plan", "check_plan"]
