"""What a search returns: the assignment, its quality and the bound it is measured against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rec.config.planner_identity import PlannerIdentity
from rec.search.assignment import Assignment
from rec.search.bound import LowerBound
from rec.search.exact import OPTIMALITY_TOLERANCE
from rec.search.space import SearchSpace


@dataclass
class SearchResult:
    space: SearchSpace
    assignment: Assignment
    bound: LowerBound
    info: PlannerIdentity | None = None  # how it was searched (e.g. Ray groups): joins the plan_id
    stats: dict[str, Any] = field(default_factory=dict)  # what the search measured (e.g. HiGHS nodes, seconds)

    @property
    def critical_path(self) -> float:
        return self.assignment.critical_path

    @property
    def gap(self) -> float:
        """Relative distance to the lower bound (0.0 means provably optimal)."""
        b = self.bound.value
        return (self.critical_path - b) / b if b > 0 else 0.0

    @property
    def optimal(self) -> bool:
        """Proven optimal: the plan meets its lower bound (within HiGHS's relative tolerance
        ``OPTIMALITY_TOLERANCE``, when the MILP proved it)."""
        return self.critical_path <= self.bound.value * (1 + OPTIMALITY_TOLERANCE)
