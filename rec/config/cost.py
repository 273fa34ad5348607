"""The cost model's settings: ``CostConfig`` (part of the plan_id) and the ``Optimizer`` whose state
it sizes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from rec.errors import Problem
from rec.profile.types import DEFAULT_PROFILE, Profile
from rec.settings import knob

# TorchRec 1.8's UVM_CACHING_RATIO (torchrec/distributed/planner/constants.py): the share of a
# fused_uvm_caching table cached in HBM unless a table or the caching_ratio setting says otherwise.
UVM_CACHING_RATIO = 0.2


class Optimizer(StrEnum):
    """Optimizer whose state TorchRec's storage estimator adds to each shard."""

    NONE = "none"
    SGD = "sgd"
    ADAM = "adam"
    ROWWISE_ADAGRAD = "rowwise_adagrad"
    ADAGRAD = "adagrad"


@dataclass(frozen=True)
class CostConfig:
    """Planner knobs that change estimates; part of the plan_id."""

    optimizer: Optimizer = field(default=Optimizer.ROWWISE_ADAGRAD, metadata=knob(
        "optimizer whose state the storage estimate adds to the shards of every table whose spec names none"))
    caching_ratio: float = field(default=UVM_CACHING_RATIO, metadata=knob(
        "share of a fused_uvm_caching table cached in HBM", minimum=0.0, maximum=1.0))
    # Read from a file (--profile, docs/profile.md); in the plan_id only when not the default.
    profile: Profile = field(default=DEFAULT_PROFILE, metadata=knob(
        "hardware profile: the cost model's bandwidths and coefficients", cli=False))

    def problems(self) -> list[Problem]:
        """What the bounds alone do not say: a cache holds some of its table (TorchRec's load_factor > 0)."""
        if self.caching_ratio == 0:
            return [Problem("--caching-ratio", "must be above 0: a fused_uvm_caching table caches some of its rows "
                                               "(TorchRec's cache load_factor is in (0, 1])")]
        return []
