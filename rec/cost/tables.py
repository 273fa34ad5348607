"""The spec's tables as numpy columns, modelled the way TorchRec sees its embedding modules.

Each table becomes one ``EmbeddingBagConfig`` (an ``EmbeddingConfig`` of an ``EmbeddingCollection``
where pooling is NONE) plus one ``ParameterConstraints`` with
``pooling_factors=[pooling_factor] * len(feature_names)`` (TorchRec reads one pooling factor per
feature; ``num_poolings`` stays the default 1.0), ``cache_params.load_factor`` (the table's
``load_factor``: the plan's choice, else the spec's ``cache_load_factor``, else ``caching_ratio``, at
least the spec's ``min_cache_load_factor``),
the table's allow-lists and its ``min_partition``. The element size is ``DataType.bytes_per_element``: 4 for FP32 and 2
otherwise, as ``EmbeddingBagCollection`` and ``EmbeddingCollection`` allocate tables for training.
An unpooled table outputs one vector per id, so its ``batch_outputs`` are its ``batch_inputs``
(TorchRec's ``is_pooled=False``). A table whose statistics hold the distinct ids of a global batch
(``distinct_per_batch`` counted at ``batch_size x world_size``) beside its hit-rate curve carries what
TorchRec's ``CacheParams.stats`` (``CacheStatistics``) gives its estimator: ``cache_fetches``, the rows
its cache fetches per iteration (``expected_miss_rate(load_factor) x expected_lookups``). TorchRec
prices them where it is given the cache's size. A shardflow plan gives every cache's
(``rec.plan.torchrec_plan``) but those at TorchRec's default size (``UVM_CACHING_RATIO``) whose spec
sizes them neither way and beside which no cache of another size shares a kernel group: those get
none (``implicit_caches``), as TorchRec's own plans give only the sizes a user stated. TorchRec and
FBGEMM build that size when given none, and TorchRec prices no fetches for such a cache, so the same
caches cost the same in either plan. (Under a profile with ``cache_miss_multiplier``, which prices
every cache's misses whatever size was given, only where every table's is the default and none was
chosen: TorchRec gives the caching tables of one kernel group one cache, sized by the load factors
its tables state, so an unstated one gets the others'.)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import numpy as np

from rec.config.cost import UVM_CACHING_RATIO, CostConfig, Optimizer
from rec.hit_rates import miss_rate
from rec.sharding import (
    CK_CODE,
    COMPUTE_KERNELS,
    SHARDING_TYPES,
    ST_CODE,
    ComputeDevice,
    ComputeKernel,
    ModuleKind,
    Pooling,
    sharder_options,
)
from rec.spec.types import Spec, TableSpec

K = TypeVar("K")  # ShardingType or ComputeKernel


@dataclass(frozen=True)
class TableArrays:
    """Per-table columns (length T) that the estimators read."""

    rows: np.ndarray  # int64 num_embeddings
    dims: np.ndarray  # int64 embedding_dim
    elem: np.ndarray  # int64 bytes per weight element as TorchRec allocates it
    num_features: np.ndarray  # int64
    pooling_factor: np.ndarray  # float64, per feature
    batch_inputs: np.ndarray  # float64 ids per rank batch: sum over features of pf * 1.0 * B
    batch_outputs: np.ndarray  # float64 output rows per rank batch: pooled, sum of min(1, pf) * 1.0 * B;
    # unpooled, batch_inputs
    priced_outputs: np.ndarray  # float64 the output rows the perf estimate prices: batch_outputs plus the
    # profile's empty_bag_output_multiplier x a pooled table's empty bags (rec.profile.types.Extensions);
    # storage keeps TorchRec's batch_outputs
    pooled: np.ndarray  # bool: the table's module pools (an EmbeddingBagCollection)
    weighted: np.ndarray  # bool: the table's ids carry weights (an is_weighted EmbeddingBagCollection)
    min_partition: np.ndarray  # int64 least column shard width (ParameterConstraints.min_partition); 0: none
    optimizer_multiplier: np.ndarray  # float64 optimizer state per weight byte
    load_factor: np.ndarray  # float64 share of the rows a fused_uvm_caching cache holds
    miss_rate: np.ndarray  # float64 share of the lookups such a cache misses (rec.hit_rates)
    cache_fetches: np.ndarray  # float64 rows such a cache fetches per global batch, TorchRec's
    # expected_cache_fetches; 0 where the table has no CacheStatistics (statistics of a global batch)
    sharding_allowed: np.ndarray  # (T, len(SHARDING_TYPES)) bool; all True where no allow-list
    kernel_allowed: np.ndarray  # (T, len(COMPUTE_KERNELS)) bool; all True where no allow-list
    kinds: tuple[ModuleKind, ...]  # the module kinds in the spec, in ModuleKind order

    def offered(self, device: ComputeDevice) -> np.ndarray:
        """(T, len(SHARDING_TYPES), len(COMPUTE_KERNELS)) bool: what each table's sharder offers."""
        out = np.zeros((len(self.rows), len(SHARDING_TYPES), len(COMPUTE_KERNELS)), bool)
        for kind in self.kinds:
            mine = self.pooled == (kind is ModuleKind.EMBEDDING_BAG_COLLECTION)
            for st, kernels in sharder_options(device, kind).items():
                for ck in kernels:
                    out[mine, ST_CODE[st], CK_CODE[ck]] = True
        return out


def table_arrays(spec: Spec, batch_size: int, config: CostConfig, load_factors: np.ndarray | None = None, *,
                 world_size: int, unstated: np.ndarray | None = None) -> TableArrays:
    """Columns of ``spec`` for a per-rank ``batch_size`` on ``world_size`` ranks; ``load_factors``
    (spec order, NaN: none) are the cache sizes a plan chose, over the spec's and the configuration's;
    ``unstated``: (T,) the caches a plan's ShardingPlan gives no size (default: ``implicit_caches``
    before tables are placed)."""
    tables = spec.tables
    n = len(tables)
    ints = np.array(
        [
            (t.num_embeddings, t.embedding_dim, t.data_type.bytes_per_element, len(t.feature_names))
            for t in tables
        ],
        dtype=np.int64,
    ).reshape(n, 4)
    rows, dims, elem, nf = (np.ascontiguousarray(c) for c in ints.T)
    nf = np.maximum(nf, 1)
    pf = np.fromiter((t.pooling_factor for t in tables), np.float64, n)
    inputs, outputs = _batch_sums(pf, nf, batch_size)
    pooled = np.fromiter((t.pooling is not Pooling.NONE for t in tables), bool, n)
    min_partition = np.fromiter((t.min_partition or 0 for t in tables), np.int64, n)
    outputs = np.where(pooled, outputs, inputs)
    priced = outputs
    empty_bags = config.profile.extensions.empty_bag_output_multiplier
    if empty_bags:  # a pooled table's samples without ids get a vector too (pooling factor below 1)
        priced = outputs + empty_bags * np.where(pooled & (pf < 1), nf * float(batch_size) - outputs, 0.0)

    st_ok = np.ones((n, len(SHARDING_TYPES)), dtype=bool)
    ck_ok = np.ones((n, len(COMPUTE_KERNELS)), dtype=bool)
    # An empty allow-list is falsy in TorchRec's filters, i.e. no constraint.
    st_lists = [(i, t.sharding_types) for i, t in enumerate(tables) if t.sharding_types]
    ck_lists = [(i, t.compute_kernels) for i, t in enumerate(tables) if t.compute_kernels]
    _apply_allow_lists(st_ok, st_lists, ST_CODE)
    _apply_allow_lists(ck_ok, ck_lists, CK_CODE)
    load_factor = resolved_load_factors(spec, config, load_factors)
    misses = miss_rates(spec, load_factor)

    return TableArrays(
        rows=rows,
        dims=dims,
        elem=elem,
        num_features=nf,
        pooling_factor=pf,
        batch_inputs=inputs,
        batch_outputs=outputs,
        priced_outputs=priced,
        pooled=pooled,
        weighted=np.fromiter((t.is_weighted for t in tables), bool, n),
        min_partition=min_partition,
        optimizer_multiplier=optimizer_multipliers(spec, config, dims),
        load_factor=load_factor,
        miss_rate=misses,
        cache_fetches=np.where(implicit_caches(spec, load_factors, load_factor, config) if unstated is None
                               else unstated, 0.0,
                               misses * global_distinct(spec, batch_size * world_size)),
        sharding_allowed=st_ok,
        kernel_allowed=ck_ok,
        kinds=tuple(k for k in ModuleKind if k in set(spec.modules.values())),
    )


def _apply_allow_lists(allowed: np.ndarray, lists: list[tuple[int, tuple[K, ...]]], code: dict[K, int]) -> None:
    """Restrict the rows of tables with an allow-list to the codes it names."""
    if not lists:
        return
    allowed[[i for i, _ in lists]] = False
    pairs = np.array([(i, code[v]) for i, values in lists for v in values])
    allowed[pairs[:, 0], pairs[:, 1]] = True


def _batch_sums(pf: np.ndarray, nf: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``ShardPerfContext.batch_inputs`` / ``batch_outputs`` with num_poolings 1.0."""
    inputs = pf * 1.0 * batch_size
    outputs = np.minimum(1.0, pf) * 1.0 * batch_size
    multi = np.flatnonzero(nf > 1)
    if len(multi):
        # TorchRec sums per-feature terms with Python's sum(); repeat it where there are several
        # features so that the float rounding (and the ceil() applied later) is identical.
        sums: dict[tuple[float, int], float] = {}
        for i, x, k in zip(multi.tolist(), inputs[multi].tolist(), nf[multi].tolist(), strict=True):
            inputs[i] = sums.setdefault((x, k), sum([x] * k))
        for i, x, k in zip(multi.tolist(), outputs[multi].tolist(), nf[multi].tolist(), strict=True):
            outputs[i] = sums.setdefault((x, k), sum([x] * k))
    return inputs, outputs


def optimizer_multiplier(optimizer: Optimizer, dims: np.ndarray) -> np.ndarray:
    """``shard_estimators._get_optimizer_multipler`` for the optimizer class TorchRec reads."""
    if optimizer in (Optimizer.NONE, Optimizer.SGD):
        return np.zeros(len(dims))
    if optimizer == Optimizer.ADAM:
        return np.full(len(dims), 2.0)
    if optimizer == Optimizer.ROWWISE_ADAGRAD:
        return 1.0 / dims  # one float32 per row: 1 / shape[-1] of the weight bytes
    return np.ones(len(dims))  # any other optimizer class: one state tensor like the weight


def table_optimizer(table: TableSpec, config: CostConfig) -> Optimizer:
    """The optimizer whose state a table's storage adds: its own (``TableSpec.optimizer``), else the
    cost model's."""
    return config.optimizer if table.optimizer is None else table.optimizer


def optimizer_multipliers(spec: Spec, config: CostConfig, dims: np.ndarray) -> np.ndarray:
    """(T,) ``optimizer_multiplier`` of each table's optimizer (``table_optimizer``), ``dims`` its columns."""
    out = optimizer_multiplier(config.optimizer, dims)
    for i, t in enumerate(spec.tables):
        if t.optimizer is not None and t.optimizer is not config.optimizer:
            out[i] = optimizer_multiplier(t.optimizer, dims[i:i + 1])[0]
    return out


def resolved_load_factors(spec: Spec, config: CostConfig, chosen: np.ndarray | None = None) -> np.ndarray:
    """(T,) each table's cache load factor: ``chosen`` where a number, else the spec's
    ``cache_load_factor``, else the configuration's ``caching_ratio`` raised to the spec's
    ``min_cache_load_factor``."""
    given = np.fromiter((config.caching_ratio if t.cache_load_factor is None else t.cache_load_factor
                         for t in spec.tables), np.float64, len(spec.tables))
    np.maximum(given, cache_floors(spec), out=given)
    if chosen is None:
        return given
    return np.where(np.isnan(chosen), given, chosen)


def allowed_load_factors(spec: Spec, chosen: np.ndarray) -> np.ndarray:
    """(T,) cache sizes ``chosen`` for another spec (NaN: none), as ``spec`` allows them: none where it
    fixes a table's size, at least its floor elsewhere."""
    out: np.ndarray = np.where(cache_fixed(spec), np.nan, np.maximum(chosen, cache_floors(spec)))
    return out


def cache_fixed(spec: Spec) -> np.ndarray:
    """(T,) bool: the spec fixes the table's cache size (``cache_load_factor``)."""
    return np.fromiter((t.cache_load_factor is not None for t in spec.tables), bool, len(spec.tables))


def cache_floors(spec: Spec) -> np.ndarray:
    """(T,) the least cache load factor each table's spec allows (``min_cache_load_factor``; 0: none)."""
    return np.fromiter((t.min_cache_load_factor or 0.0 for t in spec.tables), np.float64, len(spec.tables))


class CacheRule(Enum):
    """Which caches at TorchRec's default size a plan's ``ShardingPlan`` leaves without a load factor
    (``implicit_caches``): the rule of the plan's format."""

    EVERY = "every"  # formats before v5: each, but only where no table's size is another and none was chosen
    GROUP = "group"  # v5, and the search: each, unless a table that may share its kernel group is sized otherwise
    PLACED = "placed"  # v6: each, unless a cache sized otherwise shares its kernel group in the plan


@dataclass(frozen=True)
class CachePlacement:
    """Where a plan put each table, as far as TorchRec's kernel groups go (spec order): its kernel and
    sharding type, and the ranks of its shards (``shard_table``, ``shard_rank``: one entry per shard)."""

    kernel: np.ndarray  # (T,) ComputeKernel codes
    sharding_type: np.ndarray  # (T,) ShardingType codes
    shard_table: np.ndarray  # (S,) table of each shard
    shard_rank: np.ndarray  # (S,) rank of each shard


def implicit_caches(spec: Spec, chosen: np.ndarray | None, load_factor: np.ndarray, config: CostConfig,
                    rule: CacheRule = CacheRule.GROUP, placement: CachePlacement | None = None) -> np.ndarray:
    """(T,) bool: the ``ShardingPlan`` gives the table's cache, if it has one, no load factor, as
    TorchRec's own plans give only the sizes a user stated: each table at TorchRec's default size
    (``load_factor`` resolved; ``chosen``: the planner's sizes, spec order, NaN: none) whose spec gives it
    no size (``cache_load_factor``) or floor (``min_cache_load_factor``: a sharder's default could lie
    below it), unless a cache of another size could share its kernel group: FBGEMM gives a kernel
    group's caches the rows-weighted mean of the sizes its tables state, so an unstated cache beside a
    stated one gets another size than planned. TorchRec prices no fetches for an unstated cache.
    Under ``CacheRule.GROUP`` (the search, before tables are placed), where the planner chose no size,
    and where no table that may share the group (``kernel_group_keys``) and take a cache is sized otherwise.
    Under ``CacheRule.PLACED`` with the plan's ``placement``, each fused_uvm_caching table unless one of
    the same group and sharding type on one of its ranks is sized otherwise, a chosen size of the default
    counting as none (TorchRec groups each sharding type's tables rank by rank); the other tables are
    costed as the search costed their options. Under a profile that prices cache misses
    (``cache_miss_multiplier``: measured, the GPU's caches as FBGEMM builds them), and for plans of a
    format before v5 (``CacheRule.EVERY``), only where no table's size is another and none was chosen."""
    n = len(spec.tables)
    fixed = cache_fixed(spec) | (cache_floors(spec) > 0)
    default = load_factor == UVM_CACHING_RATIO
    none_chosen = chosen is None or bool(np.isnan(chosen).all())
    if rule is CacheRule.EVERY or config.profile.extensions.cache_miss_multiplier > 0:
        every: np.ndarray = ~fixed if none_chosen and bool(default.all()) else np.zeros(n, bool)
        return every
    free = ~fixed & default
    groups = kernel_group_keys(spec, config)
    sized = np.unique(groups[~default & np.fromiter(map(may_be_cached, spec.tables), bool, n)])
    before: np.ndarray = free & ~np.isin(groups, sized) if none_chosen else np.zeros(n, bool)
    if rule is CacheRule.GROUP:
        return before
    if placement is None:
        raise ValueError("CacheRule.PLACED needs the plan's placement")
    # One key per kernel group a cached shard falls in: (cache group, sharding type, rank).
    caching = placement.kernel == CK_CODE[ComputeKernel.FUSED_UVM_CACHING]
    cached = caching[placement.shard_table]
    t, rank = placement.shard_table[cached], placement.shard_rank[cached]
    key = (groups[t] * len(ST_CODE) + placement.sharding_type[t]) * (int(rank.max(initial=0)) + 1) + rank
    beside = np.zeros(n, bool)
    np.logical_or.at(beside, t, np.isin(key, key[~default[t]]))
    placed: np.ndarray = np.where(caching, free & ~beside, before)
    return placed


def kernel_group_keys(spec: Spec, config: CostConfig) -> np.ndarray:
    """(T,) int, numbered from 0 in spec order: what TorchRec's ``group_tables`` puts a table in an
    FBGEMM kernel group (one table-batched embedding, one cache) by, known before the search: its
    module, element size (shardflow's jobs train every type but FP32 as FP16), pooled or not,
    weighting and optimizer (a fused parameter). Tables of one key share a kernel group where they
    share a rank, a sharding type and a kernel family (``rec.analysis.rank_times.kernel_groups``).
    TorchRec parts SUM from MEAN tables too; plans of formats v5 and v6 state their caches by this
    key, and read back as they were planned."""
    ids: dict[tuple[str, int, bool, bool, Optimizer], int] = {}
    return np.fromiter((ids.setdefault((t.module, t.data_type.bytes_per_element, t.pooling is not Pooling.NONE,
                                        t.is_weighted, table_optimizer(t, config)), len(ids)) for t in spec.tables),
                       np.int64, len(spec.tables))


def may_be_cached(t: TableSpec) -> bool:
    """Whether the table may take the fused_uvm_caching kernel (its allow-list, if any, has it)."""
    return not t.compute_kernels or ComputeKernel.FUSED_UVM_CACHING in t.compute_kernels


def global_distinct(spec: Spec, global_batch: int) -> np.ndarray:
    """(T,) TorchRec's ``CacheStatistics.expected_lookups`` of each table: its distinct ids in a batch
    of ``global_batch`` samples, where its statistics were counted at that batch beside a hit-rate
    curve; 0 elsewhere (TorchRec prices no cache fetches without statistics)."""
    return np.fromiter((t.distinct_per_batch if t.distinct_per_batch is not None and t.hit_rate_curve is not None
                        and t.stats_batch_size == global_batch else 0.0 for t in spec.tables),
                       np.float64, len(spec.tables))


def miss_rates(spec: Spec, load_factor: np.ndarray) -> np.ndarray:
    """(T,) the share of each table's lookups its cache at ``load_factor`` misses: its hit-rate curve,
    else the skew model (``rec.hit_rates``)."""
    out = miss_rate(load_factor)
    for i, t in enumerate(spec.tables):
        if t.hit_rate_curve is not None:
            out[i] = miss_rate(load_factor[i], t.hit_rate_curve)
    return out
