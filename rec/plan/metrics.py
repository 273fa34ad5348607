"""What a plan claims it costs (``plan.json``'s ``metrics``, docs/plan-format.md): typed values.

``BoundMethod`` names how the lower bound was proven (the search proves it, ``rec.search.bound``;
the plan records it); ``Movement`` is what a replanned plan moves (``rec.plan.movement`` measures it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal


class BoundMethod(StrEnum):
    """How the reported lower bound was proven (plan.json ``metrics.bound_method``)."""

    LARGEST_SHARD = "largest_shard"
    AVERAGE_WORK = "average_work"
    LAGRANGIAN = "lagrangian"
    MILP = "milp"


# What plans read from format v1 say instead: they do not record how their bound was proven.
UNKNOWN_BOUND: Final = "unknown"


@dataclass(frozen=True)
class Movement:
    """What a replanned plan moves compared with the plan it replaces (``rec.plan.movement``)."""

    moved_bytes: int
    total_bytes: int  # parameter + optimizer bytes of the whole new plan (every replica)
    moved_tables: int  # kept or resized tables with at least one moved byte
    kept_tables: int
    added_tables: int
    removed_tables: int
    resized_tables: int
    reinitialized_tables: int
    fresh_critical_path: float | None = None  # of the plan searched from scratch in the same run
    bytes_in: tuple[int, ...] = ()  # per rank: moved bytes arriving
    bytes_out: tuple[int, ...] = ()  # per rank: moved bytes leaving

    @property
    def moved_fraction(self) -> float:
        return self.moved_bytes / self.total_bytes if self.total_bytes else 0.0


def shown_gap(gap: float) -> float:
    """``gap`` as reports show it: a critical path below its proven bound lies within the solver's
    tolerance of it (a bound holds), which is a gap of 0, not "-0.00%"."""
    return max(gap, 0.0)


@dataclass(frozen=True)
class PlanMetrics:
    critical_path: float  # ms: the busiest rank's estimated time
    lower_bound: float  # ms: proven by ``bound_method``
    gap: float  # critical_path / lower_bound - 1
    rank_perf: tuple[float, ...]  # per rank: ms
    rank_hbm: tuple[int, ...]  # per rank: bytes
    rank_ddr: tuple[int, ...]
    rank_hbm_cap: tuple[int, ...]  # per rank: usable bytes after the storage reservation
    rank_ddr_cap: tuple[int, ...]
    bound_method: BoundMethod | Literal["unknown"] = UNKNOWN_BOUND  # v1 plans do not say
    optimal: bool = False  # proven optimal: the critical path equals a proven lower bound
    movement: Movement | None = None  # replanned from a previous plan: what it moves
