"""The search's settings: ``SearchConfig``, part of the plan_id."""

from __future__ import annotations

from dataclasses import dataclass, field

from rec.settings import MAX_TIME_LIMIT_S, knob


@dataclass(frozen=True)
class SearchConfig:
    """Search knobs; part of the plan_id.

    ``time_limit_s`` caps the exact stage (HiGHS) in wall-clock seconds; 0 skips it. The
    stage's own budgets (branch-and-bound nodes, neighbourhood steps) are deterministic and sized
    from it, so plans do not depend on machine load unless the cap is reached first (see
    ``rec.search.exact``). Where the heuristic plan is within 1% of the bound the stage takes at most
    a second, so small and easy specs plan nearly as fast as without it."""

    shard_limits: int = field(default=12, metadata=knob(
        "candidate largest-shard limits tried between the bound and no limit", minimum=1, maximum=1000))
    refine_rounds: int = field(default=100_000, metadata=knob(
        "cap on local-search steps per candidate", minimum=0, maximum=10**9))
    refine_top: int = field(default=2, metadata=knob(
        "candidates per family (best after packing) that get the local search", minimum=1, maximum=1000))
    switch_above_gap: float = field(default=0.002, metadata=knob(
        "search other options per table while further than this off the bound", minimum=0.0, maximum=1.0))
    switch_steps: int = field(default=200, metadata=knob(
        "cap on option changes per pass", minimum=0, maximum=10**6))
    time_limit_s: float = field(default=30.0, metadata=knob(
        "seconds the exact stage (HiGHS MILP) may take to improve the plan and prove its bound; "
        "0: heuristic only (like TorchRec's timeout_seconds, a cap, not a target)",
        flag="time-limit", minimum=0.0, maximum=MAX_TIME_LIMIT_S, metavar="SECONDS"))


# Knobs added after plans were first written, each with the value that searches as shardflow did
# before it: a plan.json written then lacks them (docs/plan-format.md), and is read with these.
KNOBS_ADDED_LATER: dict[str, int | float] = {
    "refine_top": 1000,  # every candidate got the local search
    "switch_above_gap": 1.0,  # no switching of a table's options ...
    "switch_steps": 0,  # ... (one knob alone says it; both are recorded together)
    "time_limit_s": 0.0,  # no exact stage
}
