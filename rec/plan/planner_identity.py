"""What made a plan, as the plan records it (``plan.json``'s ``planner``) and its plan_id covers.

``PlannerIdentity``: the cost model's settings (``CostConfig``, its profile included), the search's
knobs (``SearchConfig``), how the search ran (a backend other than the local one and its table
groups), what a replan started from, and, for a plan another planner made, that planner
(``MadeBy``). The search's knobs and the planners' names live here, below both the plan value and
the search that reads them, so the plan value never imports the search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from rec.cost.types import CostConfig
from rec.profile.types import Profile
from rec.settings import MAX_TIME_LIMIT_S, knob


class Planner(StrEnum):
    """The planners a plan can be made by (``shardflow plan --planner``)."""

    SHARDFLOW = "shardflow"  # shardflow's search (rec.planning.plan_spec)
    TORCHREC = "torchrec"  # TorchRec's EmbeddingShardingPlanner, its default proposers
    TORCHREC_DP = "torchrec-dp"  # the same with its DynamicProgrammingProposer


@dataclass(frozen=True)
class SearchConfig:
    """Search knobs; part of the plan_id.

    ``time_limit_s`` caps the exact stage (HiGHS) in wall-clock seconds; 0 skips it. The
    stage's own budgets (branch-and-bound nodes, neighbourhood steps) are deterministic and sized
    from it, so plans do not depend on machine load unless the cap is reached first (see
    ``rec.search.exact``). The stage is skipped anyway when the heuristic plan is within 1% of
    the bound, so small and easy specs plan as fast as without it."""

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


@dataclass(frozen=True)
class MadeBy:
    """A planner other than shardflow's search that made the plan (``planner.made_by``)."""

    name: Planner  # TORCHREC or TORCHREC_DP
    torchrec: str  # the TorchRec version
    proposers: tuple[str, ...]  # its proposers' class names
    seconds: float  # how long it planned: measured, so the plan_id leaves it out


@dataclass(frozen=True)
class PlannerIdentity:
    """The planner configuration a plan_id covers (docs/plan-format.md, ``planner``)."""

    cost: CostConfig = field(default_factory=CostConfig)
    search: SearchConfig | None = field(default_factory=SearchConfig)  # None: another planner's plan
    backend: str | None = None  # a search not in this process: "ray" or "auto" ...
    groups: int | None = None  # ... in this many table groups (None: chosen when searching, a request's)
    previous_plan_id: str | None = None  # replanned from this plan ...
    max_regress: float | None = None  # ... within this much of a plan searched from scratch
    made_by: MadeBy | None = None

    @property
    def profile(self) -> Profile:
        """The hardware profile the plan was made under (the default when it records none)."""
        return self.cost.profile

    @property
    def planner(self) -> Planner:
        """Who made the plan: shardflow's search unless ``made_by`` names another planner."""
        return Planner.SHARDFLOW if self.made_by is None else self.made_by.name
