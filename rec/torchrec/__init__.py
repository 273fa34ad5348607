"""shardflow for TorchRec scripts: ``ShardflowPlanner``, a drop-in for TorchRec's
``EmbeddingShardingPlanner`` (docs/torchrec-planner.md), and ``torchrec_plan``, TorchRec's own
planner's plan as a shardflow ``Plan`` (``shardflow plan --planner torchrec``).

Both import torch and torchrec when used, not when this package is imported. ``score`` rates a plan
with TorchRec's own planner and estimators, ``topology`` converts topologies both ways. The planner
names the CLI offers are ``rec.config.planner_identity.Planner``, on the planning path, which never
loads torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShardflowPlanner", "torchrec_plan"]


def __getattr__(name: str) -> Any:
    if name == "ShardflowPlanner":
        from rec.torchrec.planner import ShardflowPlanner

        return ShardflowPlanner
    if name == "torchrec_plan":
        from rec.torchrec.stock_plan import torchrec_plan

        return torchrec_plan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
