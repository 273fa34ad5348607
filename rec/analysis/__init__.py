"""Plan analysis: what needs the plan value together with the cost model and the search, above all
three — a plan built from a search result (``build``), a plan read back checked and its metrics
recomputed (``check``, ``recompute``), a plan's predicted time per rank under any profile
(``rank_times``) and its one predicted iteration time (``iteration_time``). ``rec.plan`` holds the
value itself and imports none of this."""

from rec.analysis.build import build_plan
from rec.analysis.check import check_plan

__all__ = ["build_plan", "check_plan"]
