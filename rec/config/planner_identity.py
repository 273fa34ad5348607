"""What made a plan, as the plan records it (``plan.json``'s ``planner``) and its plan_id covers.

``PlannerIdentity``: the cost model's settings (``CostConfig``, its profile included), the search's
knobs (``SearchConfig``), how the search ran (a backend other than the local one and its table
groups), what a replan started from, and, for a plan another planner made, that planner
(``MadeBy``). It lives in ``rec.config``, below both the plan value that records it and the cost
model and search that read its settings, so the plan value imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from rec.config.cost import CostConfig
from rec.config.search import SearchConfig
from rec.profile.types import Profile


class Planner(StrEnum):
    """The planners a plan can be made by (``shardflow plan --planner``)."""

    SHARDFLOW = "shardflow"  # shardflow's search (rec.planning.plan_spec)
    TORCHREC = "torchrec"  # TorchRec's EmbeddingShardingPlanner, its default proposers
    TORCHREC_DP = "torchrec-dp"  # the same with its DynamicProgrammingProposer


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
    # Search knobs a plan of an earlier version does not record (``KNOBS_ADDED_LATER``: their values in
    # ``search``): plan.json and the plan_id leave them out, as that version wrote them.
    unrecorded: tuple[str, ...] = ()

    @property
    def profile(self) -> Profile:
        """The hardware profile the plan was made under (the default when it records none)."""
        return self.cost.profile

    @property
    def planner(self) -> Planner:
        """Who made the plan: shardflow's search unless ``made_by`` names another planner."""
        return Planner.SHARDFLOW if self.made_by is None else self.made_by.name
