"""Search knobs; part of the plan_id. The plan records them, so they live with the plan's planner
identity (``rec.plan.planner_identity``), below the search."""

from __future__ import annotations

from rec.plan.planner_identity import SearchConfig

__all__ = ["SearchConfig"]
