"""Convert a Plan into the torchrec ``ShardingPlan`` DistributedModelParallel accepts.

Imports torch/torchrec; only the training job and the benchmarks load this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rec.plan.types import Plan
from rec.sharding import ShardingType

if TYPE_CHECKING:
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan


def module_sharding_plan(plan: Plan) -> EmbeddingModuleShardingPlan:
    """The ``EmbeddingModuleShardingPlan`` for one EmbeddingBagCollection holding every table."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.planner.utils import placement
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding

    device = plan.topology["compute_device"]
    local = int(plan.topology["local_world_size"])
    module_plan = EmbeddingModuleShardingPlan()
    for t in plan.tables:
        spec = None
        if t.sharding_type is not ShardingType.DATA_PARALLEL:
            spec = EnumerableShardingSpec([
                ShardMetadata(shard_offsets=list(s.offsets), shard_sizes=list(s.sizes),
                              placement=placement(device, s.rank, local))
                for s in t.shards
            ])
        module_plan[t.name] = ParameterSharding(
            sharding_type=t.sharding_type.value,
            compute_kernel=t.compute_kernel.value,
            ranks=list(t.ranks),
            sharding_spec=spec,
        )
    return module_plan


def to_sharding_plan(plan: Plan, module_path: str = "") -> ShardingPlan:
    """A ``ShardingPlan`` with the EmbeddingBagCollection at ``module_path`` in the model."""
    from torchrec.distributed.types import ShardingPlan

    return ShardingPlan({module_path: module_sharding_plan(plan)})
