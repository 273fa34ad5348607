"""Search knobs; part of the plan_id."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchConfig:
    shard_limits: int = 12  # candidate largest-shard limits tried between the bound and no limit
    refine_rounds: int = 100_000  # cap on local-search steps per candidate
    refine_top: int = 2  # candidates per family (best after packing) that get the local search
    switch_above_gap: float = 0.002  # search other options per table while further off the bound
    switch_steps: int = 200  # cap on option changes per pass
