"""How exact the search's comparisons are: one constant per thing a comparison guards against."""

from __future__ import annotations

# Float noise of summed times (ms), relative: loads summed in another order differ by about this.
# Below it a change is no change: a step must gain more, a plan may exceed its target by as much,
# a bound must rise by more to count as stronger.
TIME_NOISE = 1e-12

# HiGHS's feasibility tolerance (``rec.search.milp.solve`` sets it): a MILP's solution may break a
# row by this much, relative to the model's scale, so what a MILP finds is only this exact: a
# decoded plan may exceed its target by it, an improvement must beat it, and ranks within it of the
# critical path are the busiest alike.
SOLVER_TOLERANCE = 1e-9


def lowers(peak: float, critical_path: float) -> bool:
    """Whether a step to ``peak`` lowers the busiest rank by more than float noise (absolute below 1 ms)."""
    return peak < critical_path - TIME_NOISE * max(critical_path, 1.0)
