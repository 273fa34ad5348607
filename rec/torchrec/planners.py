"""The planners a plan can be made by (``shardflow plan --planner``); no torch here. A plan records
which one made it, so the names live with the plan's planner identity."""

from __future__ import annotations

from rec.plan.planner_identity import Planner

__all__ = ["Planner"]
