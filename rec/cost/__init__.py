"""Vectorized cost model faithful to TorchRec 1.8's enumerator and shard estimators; its settings
(``CostConfig``, ``Optimizer``) are ``rec.config.cost``."""

from __future__ import annotations

from rec.cost.enumerator import NoOptionLeft, enumerate_options
from rec.cost.reservation import rank_capacity
from rec.cost.types import Options

__all__ = [
    "NoOptionLeft",
    "Options",
    "enumerate_options",
    "rank_capacity",
]
