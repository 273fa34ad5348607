"""Search knobs; part of the plan_id."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchConfig:
    """``time_limit_s`` caps the exact stage (HiGHS) in wall-clock seconds; 0 skips it. The
    stage's own budgets (branch-and-bound nodes, neighbourhood steps) are deterministic and sized
    from it, so plans do not depend on machine load unless the cap is reached first (see
    ``rec.search.exact``). The stage is skipped anyway when the heuristic plan is within 1% of
    the bound, so small and easy specs plan as fast as without it."""

    shard_limits: int = 12  # candidate largest-shard limits tried between the bound and no limit
    refine_rounds: int = 100_000  # cap on local-search steps per candidate
    refine_top: int = 2  # candidates per family (best after packing) that get the local search
    switch_above_gap: float = 0.002  # search other options per table while further off the bound
    switch_steps: int = 200  # cap on option changes per pass
    time_limit_s: float = 10.0  # wall-clock cap on the exact stage
