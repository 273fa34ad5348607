"""The planners a plan can be made by (``shardflow plan --planner``); no torch here."""

from __future__ import annotations

from enum import StrEnum


class Planner(StrEnum):
    SHARDFLOW = "shardflow"  # shardflow's search (rec.planning.plan_spec)
    TORCHREC = "torchrec"  # TorchRec's EmbeddingShardingPlanner, its default proposers
    TORCHREC_DP = "torchrec-dp"  # the same with its DynamicProgrammingProposer
