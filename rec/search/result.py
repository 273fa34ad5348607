"""What a search returns: the assignment, its quality and the bound it is measured against."""

from __future__ import annotations

from dataclasses import dataclass, field

from rec.search.assignment import Assignment
from rec.search.bound import LowerBound
from rec.search.space import SearchSpace


@dataclass
class SearchResult:
    space: SearchSpace
    assignment: Assignment
    bound: LowerBound
    info: dict = field(default_factory=dict)  # how it was searched, e.g. Ray groups

    @property
    def critical_path(self) -> float:
        return self.assignment.critical_path

    @property
    def gap(self) -> float:
        """Relative distance to the lower bound (0.0 means provably optimal)."""
        b = self.bound.value
        return (self.critical_path - b) / b if b > 0 else 0.0
