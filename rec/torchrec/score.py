"""Score plans with TorchRec itself: the independent check that shardflow's plans are as good as claimed.

``torchrec_inputs`` builds exactly what TorchRec would plan for the spec (a model holding the spec's
embedding modules at their paths — EmbeddingBagCollections and EmbeddingCollections — and the
ParameterConstraints, Topology and sharders ``rec.cost`` stands for); ``run_torchrec_planner`` runs
TorchRec's EmbeddingShardingPlanner on them (``planner.plan(model, sharders)``, as for any model);
``score_plan`` rates a shardflow Plan with TorchRec's enumerator, estimators and ``NoopPerfModel``,
matching each option to a table by (module path, name). torch/torchrec are imported inside the functions:
only the benchmarks and tests load them.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rec.config.cost import UVM_CACHING_RATIO, CostConfig, Optimizer
from rec.cost.tables import global_distinct, implicit_caches, resolved_load_factors, table_optimizer
from rec.hit_rates import Curve, miss_rate
from rec.plan.load_factors import unstated_caches
from rec.plan.table_placement import ShardPlacement, TablePlacement
from rec.plan.types import Plan
from rec.spec.types import Spec
from rec.topology.types import Topology
from rec.torchrec.topology import torchrec_topology
from rec.torchrec_internals import mark_optimizer, planner_result

if TYPE_CHECKING:
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
    from torchrec.distributed.planner.types import Topology as TorchrecTopology


@dataclass(frozen=True)
class TorchrecRun:
    """One run of TorchRec's EmbeddingShardingPlanner; critical_path is NoopPerfModel's rating (ms)."""

    proposer: str
    seconds: float
    critical_path: float
    num_proposals: int
    num_plans: int
    sharding_types: dict[str, int]
    chosen: tuple[TablePlacement, ...] = ()  # the best plan, one entry per table, shards in TorchRec's order


@dataclass(frozen=True)
class TorchrecScore:
    """A shardflow plan as TorchRec rates it: per-rank perf and storage against its reserved capacity."""

    critical_path: float
    rank_perf: tuple[float, ...]
    rank_hbm: tuple[int, ...]
    rank_ddr: tuple[int, ...]
    rank_hbm_cap: tuple[int, ...]  # after HeuristicalStorageReservation
    rank_ddr_cap: tuple[int, ...]

    @property
    def over_capacity(self) -> tuple[int, ...]:
        """Ranks whose HBM or DDR exceeds what TorchRec's storage reservation leaves."""
        return tuple(r for r in range(len(self.rank_perf))
                     if self.rank_hbm[r] > self.rank_hbm_cap[r] or self.rank_ddr[r] > self.rank_ddr_cap[r])


class CurveStatistics:
    """TorchRec's ``CacheStatistics`` of a spec table's statistics: its hit-rate curve (``rec.hit_rates``)
    and its distinct ids in a global batch."""

    def __init__(self, curve: Curve, lookups: float) -> None:
        self._curve, self._lookups = curve, lookups

    @property
    def expected_lookups(self) -> float:
        return self._lookups

    def expected_miss_rate(self, clf: float) -> float:
        return float(miss_rate(clf, self._curve))

    @property
    def cacheability(self) -> float:
        """The mean miss rate over cache sizes: 0 very cacheable, 1 not at all (TorchRec's scale)."""
        return float(np.mean(miss_rate(np.linspace(0.0, 1.0, 101), self._curve)))


def _optimizer_class(optimizer: Optimizer) -> type[Any] | None:
    import torch
    import torchrec.optim as trec_optim

    classes: dict[Optimizer, type[Any] | None] = {
        Optimizer.NONE: None,
        Optimizer.SGD: torch.optim.SGD,
        Optimizer.ADAM: torch.optim.Adam,
        Optimizer.ROWWISE_ADAGRAD: trec_optim.RowWiseAdagrad,
        Optimizer.ADAGRAD: torch.optim.Adagrad,
    }
    return classes[optimizer]


def torchrec_inputs(spec: Spec, topology: Topology, cost: CostConfig = CostConfig(),
                    load_factors: np.ndarray | None = None, unstated: np.ndarray | None = None
                    ) -> tuple[Any, dict[str, Any], TorchrecTopology, list[Any]]:
    """(the spec's modules at their paths on the meta device, constraints by table name, TorchRec
    Topology, sharders): what shardflow plans. TorchRec keys constraints by table name alone: tables
    sharing a name in several modules get the first one's. Each table's ``cache_params.load_factor``
    is its own (``rec.cost.tables.resolved_load_factors`` of ``load_factors``, spec order: a floor
    raised to the cost model's ``caching_ratio`` where none is given, the size shardflow starts at); a table
    whose statistics TorchRec can read (``rec.cost.tables.global_distinct``) gets them as its
    ``cache_params.stats``, its load factor given as a shardflow plan gives it (none for a cache of
    TorchRec's default size the spec does not fix: ``unstated``, else ``rec.cost.tables.implicit_caches``), so that
    TorchRec prices its cache's fetches where shardflow's cost model does."""
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    from rec.plan.torchrec_plan import module_sharders
    from rec.spec.torchrec_modules import spec_model

    model = spec_model(spec)
    for t in spec.tables:  # as apply_optimizer_in_backward marks each table's weight
        optimizer_class = _optimizer_class(table_optimizer(t, cost))
        if optimizer_class is not None:
            module: Any = model.get_submodule(t.module)
            mark_optimizer((module.embedding_bags if t.pooled else module.embeddings)[t.name].weight, optimizer_class)
    constraints: dict[str, Any] = {}
    resolved = resolved_load_factors(spec, cost, load_factors)
    implicit = (implicit_caches(spec, load_factors, resolved, cost) if unstated is None else unstated).tolist()
    factors = resolved.tolist()
    distinct = global_distinct(spec, topology.batch_size * topology.world_size).tolist()
    for t, factor, lookups, default in zip(spec.tables, factors, distinct, implicit, strict=True):
        stats = CurveStatistics(t.hit_rate_curve, lookups) if lookups and t.hit_rate_curve else None
        constraints.setdefault(t.name, ParameterConstraints(
            sharding_types=[s.value for s in t.sharding_types] if t.sharding_types else None,
            compute_kernels=[k.value for k in t.compute_kernels] if t.compute_kernels else None,
            pooling_factors=[t.pooling_factor] * len(t.feature_names),
            # TorchRec's default where it is the default, so that its planner reads the same constraints
            cache_params=None if (factor == UVM_CACHING_RATIO and t.cache_load_factor is None
                                  and t.min_cache_load_factor is None and stats is None)
            else CacheParams(load_factor=None if default else factor, stats=stats),
            min_partition=t.min_partition,
        ))
    return model, constraints, torchrec_topology(topology), module_sharders(set(spec.modules.values()))


def _storage_reservation(topology: Topology) -> HeuristicalStorageReservation:
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

    return HeuristicalStorageReservation(percentage=topology.storage_reservation)


def run_torchrec_planner(spec: Spec, topology: Topology, cost: CostConfig = CostConfig(),
                         proposer: Any = None, timeout_s: int | None = None) -> TorchrecRun:
    """Run TorchRec's EmbeddingShardingPlanner (``proposer`` None: its four default proposers)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.perf_models import NoopPerfModel

    model, constraints, trec_topology, sharders = torchrec_inputs(spec, topology, cost)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        planner = EmbeddingShardingPlanner(
            topology=trec_topology,
            batch_size=topology.batch_size,
            constraints=constraints,
            storage_reservation=_storage_reservation(topology),
            proposer=proposer,
            timeout_seconds=timeout_s,
        )
        planner.plan(model, sharders)
        seconds = time.perf_counter() - started
    best, names, proposals, plans = planner_result(planner)
    return TorchrecRun(
        proposer=names,
        seconds=seconds,
        critical_path=float(NoopPerfModel(trec_topology).rate(best)),
        num_proposals=proposals,
        num_plans=plans,
        sharding_types=dict(sorted(Counter(o.sharding_type for o in best).items())),
        chosen=tuple(TablePlacement(o.path, o.name, o.sharding_type, o.compute_kernel, tuple(
            ShardPlacement(int(s.rank), (int(s.offset[0]), int(s.offset[1])), (int(s.size[0]), int(s.size[1])))
            for s in o.shards)) for o in best),
    )


def torchrec_score(plan: Plan, spec: Spec, topology: Topology, cost: CostConfig = CostConfig()) -> TorchrecScore:
    """Rate ``plan`` with TorchRec: its enumerator's shards and estimates, the plan's ranks, NoopPerfModel."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.perf_models import NoopPerfModel
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator

    from rec.plan.torchrec_plan import to_sharding_plan

    chosen_of = dict(zip(plan.columns.keys, plan.columns.load_factor.tolist(), strict=True))  # type: ignore[union-attr]
    chosen_factors = np.array([chosen_of.get(t.key, np.nan) for t in spec.tables])
    model, constraints, trec_topology, sharders = torchrec_inputs(spec, topology, cost, chosen_factors,
                                                                  unstated_caches(plan))
    enumerator = EmbeddingEnumerator(
        topology=trec_topology,
        batch_size=topology.batch_size,
        constraints=constraints,
        estimator=[EmbeddingPerfEstimator(trec_topology, constraints),
                   EmbeddingStorageEstimator(trec_topology, constraints)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = enumerator.enumerate(model, sharders)
        reserved = _storage_reservation(topology).reserve(
            trec_topology, topology.batch_size, model, sharders, constraints)
    chosen = plan_options(to_sharding_plan(plan), options)

    world = topology.world_size
    perf, hbm, ddr = [0.0] * world, [0] * world, [0] * world
    for option in chosen:
        for shard in option.shards:
            perf[shard.rank] += shard.perf.total
            hbm[shard.rank] += shard.storage.hbm
            ddr[shard.rank] += shard.storage.ddr
    return TorchrecScore(
        critical_path=float(NoopPerfModel(trec_topology).rate(chosen)),
        rank_perf=tuple(perf),
        rank_hbm=tuple(hbm),
        rank_ddr=tuple(ddr),
        rank_hbm_cap=tuple(int(d.storage.hbm) for d in reserved.devices),
        rank_ddr_cap=tuple(int(d.storage.ddr) for d in reserved.devices),
    )


def plan_options(sharding_plan: Any, options: Iterable[Any]) -> list[Any]:
    """TorchRec's option (its enumerator's ``ShardingOption``) for each table of ``sharding_plan`` (a
    ``ShardingPlan``), matched by module path, table, sharding type and kernel, its shards on the
    plan's ranks. Shards are matched by (offsets, sizes); repeated keys (empty row_wise shards) take
    the plan's ranks in order, as TorchRec's partitioner does; a data_parallel table's replicas go
    to its ranks."""
    by_key = {(o.path, o.name, o.sharding_type, o.compute_kernel): o for o in options}
    chosen = []
    for path, module_plan in sharding_plan.plan.items():
        for name, p in module_plan.items():
            key = (path, name, p.sharding_type, p.compute_kernel)
            if key not in by_key:
                raise ValueError(f"TorchRec enumerates no {key[2]}/{key[3]} option for table {path}.{name}")
            option = by_key[key]
            planned = len(p.ranks) if p.sharding_spec is None else len(p.sharding_spec.shards)
            if planned != len(option.shards):
                raise ValueError(f"table {path}.{name}: plan has {planned} shards, TorchRec {len(option.shards)}")
            if p.sharding_spec is None:
                ranks = list(p.ranks)
            else:
                at: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = defaultdict(list)
                for s in p.sharding_spec.shards:
                    at[(tuple(s.shard_offsets), tuple(s.shard_sizes))].append(s.placement.rank())
                ranks = []
                for shard in option.shards:
                    queue = at.get((tuple(shard.offset), tuple(shard.size)))
                    if not queue:
                        raise ValueError(f"table {path}.{name}: no plan shard at offset {shard.offset} "
                                         f"size {shard.size}")
                    ranks.append(queue.pop(0))
            for shard, r in zip(option.shards, ranks, strict=True):
                shard.rank = r
            chosen.append(option)
    return chosen


def score_plan(plan: Plan, spec: Spec, topology: Topology, cost: CostConfig = CostConfig()) -> float:
    """The plan's critical path (ms) as TorchRec rates it; warns if a rank exceeds TorchRec's capacity."""
    score = torchrec_score(plan, spec, topology, cost)
    if score.over_capacity:
        warnings.warn(f"plan {plan.plan_id} exceeds TorchRec's reserved HBM/DDR on ranks "
                      f"{list(score.over_capacity)}", RuntimeWarning, stacklevel=2)
    return score.critical_path
