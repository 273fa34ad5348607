"""Convert a Plan into the torchrec ``ShardingPlan`` DistributedModelParallel accepts, and name the
sharders it needs: a user's own training script shards its model with exactly the plan.

    plan = read_plan("out/my_plan")
    model = DistributedModelParallel(model, plan=to_sharding_plan(plan), sharders=sharders_for(plan))

Imports torch/torchrec; only training jobs, the benchmarks and the tests load this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rec.plan.types import Plan, TablePlan
from rec.sharding import ComputeKernel, ModuleKind, Pooling, ShardingType

if TYPE_CHECKING:
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan


def module_sharding_plan(plan: Plan, module: str | None = None) -> EmbeddingModuleShardingPlan:
    """The ``EmbeddingModuleShardingPlan`` of the tables of ``module`` (the embedding module's path in
    the model), what its sharder takes, EmbeddingBagCollectionSharder and EmbeddingCollectionSharder
    alike. ``module`` None: every table of a plan whose tables are all in one module."""

    modules = plan_modules(plan)
    if module is None:
        if len(modules) > 1:
            raise ValueError(f"plan {plan.plan_id} has tables in {len(modules)} modules "
                             f"({', '.join(modules)}): name one, or use to_sharding_plan")
        module = next(iter(modules))
    if module not in modules:
        raise ValueError(f"plan {plan.plan_id} has no tables in module {module!r} (it has {', '.join(modules)})")
    return _module_plan(plan, module, _cache_sizes(plan))


def _module_plan(plan: Plan, module: str, sizes: dict[str, float | None]) -> EmbeddingModuleShardingPlan:
    """``module_sharding_plan`` of a module the plan has, its caches of ``sizes`` (``_cache_sizes``)."""
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    module_plan = EmbeddingModuleShardingPlan()
    for t in plan.tables:
        if t.module == module:
            module_plan[t.name] = _parameter_sharding(plan, t, sizes[t.key])
    return module_plan


def _cache_sizes(plan: Plan) -> dict[str, float | None]:
    """Each table's cache load factor (``rec.plan.load_factors``) by key; None where its cache goes
    without one (``rec.cost.tables.implicit_caches``)."""
    from rec.plan.load_factors import load_factors, unstated_caches

    factors, flags = load_factors(plan), unstated_caches(plan)
    return {t.key: None if flag else float(factor)
            for t, factor, flag in zip(plan.spec.tables, factors, flags, strict=True)}


def to_sharding_plan(plan: Plan, module_path: str | None = None) -> ShardingPlan:
    """A ``ShardingPlan`` with one entry per embedding module of the plan, at the module's path
    (each table's ``module``; tables without one are in ``rec.spec.types.DEFAULT_MODULE``).

    ``module_path`` addresses a one-module plan's module at another path: ``""`` when the model is
    the EmbeddingBagCollection itself."""
    from torchrec.distributed.types import ShardingPlan

    if module_path is not None:
        return ShardingPlan({module_path: module_sharding_plan(plan)})
    sizes = _cache_sizes(plan)  # once for every module
    return ShardingPlan({module: _module_plan(plan, module, sizes) for module in plan_modules(plan)})


def sharders_for(plan: Plan) -> list[Any]:
    """TorchRec's sharders the plan's modules need (``EmbeddingBagCollectionSharder``,
    ``EmbeddingCollectionSharder``), with their defaults, as shardflow's cost model rates them."""
    return module_sharders(set(plan_modules(plan).values()))


def module_sharders(kinds: set[ModuleKind]) -> list[Any]:
    """TorchRec's default sharder of each module kind in ``kinds``, in ``ModuleKind`` order."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    sharders = {ModuleKind.EMBEDDING_BAG_COLLECTION: EmbeddingBagCollectionSharder,
                ModuleKind.EMBEDDING_COLLECTION: EmbeddingCollectionSharder}
    return [sharders[kind]() for kind in ModuleKind if kind in kinds]


def plan_modules(plan: Plan) -> dict[str, ModuleKind]:
    """Each embedding module of the plan and its kind, in plan order (a table's pooling, from the
    spec rows the plan carries, decides the kind: NONE is an EmbeddingCollection)."""
    unpooled = {t.key for t in plan.spec.tables if t.pooling is Pooling.NONE}
    modules: dict[str, ModuleKind] = {}
    for t in plan.tables:
        kind = ModuleKind.EMBEDDING_COLLECTION if t.key in unpooled else ModuleKind.EMBEDDING_BAG_COLLECTION
        modules.setdefault(t.module, kind)
    return modules


def _parameter_sharding(plan: Plan, t: TablePlan, load_factor: float | None) -> Any:
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.planner.utils import placement
    from torchrec.distributed.types import CacheParams, ParameterSharding

    device = plan.topology.compute_device.value
    local = plan.topology.local_world_size
    spec = None
    if t.sharding_type is not ShardingType.DATA_PARALLEL:
        spec = EnumerableShardingSpec([
            ShardMetadata(shard_offsets=list(s.offsets), shard_sizes=list(s.sizes),
                          placement=placement(device, s.rank, local))
            for s in t.shards
        ])
    cache = None
    if t.compute_kernel is ComputeKernel.FUSED_UVM_CACHING:
        cache = CacheParams(load_factor=load_factor)
    return ParameterSharding(
        sharding_type=t.sharding_type.value,
        compute_kernel=t.compute_kernel.value,
        ranks=list(t.ranks),
        sharding_spec=spec,
        cache_params=cache,
    )
