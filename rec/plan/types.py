"""The Plan type: what every table becomes and what it costs (``plan.json``, see docs/plan-format.md).

A ``Plan`` is typed all the way down: its ``Topology``, the ``PlannerIdentity`` its plan_id covers,
its ``PlanMetrics`` (a ``BoundMethod``, a ``Movement``) and its ``Spec``; dicts exist only where
plan.json is read and written (``rec.plan.parse``, ``rec.plan.plan_json``).

A data_parallel table has one full replica on every rank; it is held as ``Replicas`` (one shard
and the world size) and ``range(world_size)`` ranks, so 100,000 replicated tables on 1,024 ranks
stay small. Both still read as the full sequences of shards and ranks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from rec.config.planner_identity import PlannerIdentity
from rec.cost.tables import CacheRule
from rec.plan.metrics import BoundMethod, Movement, PlanMetrics
from rec.sharding import CK_CODE, ComputeKernel, ShardingType
from rec.spec.types import DEFAULT_MODULE, Spec, table_key
from rec.topology.types import Topology

if TYPE_CHECKING:
    from rec.plan.columns import TableColumns

PLAN_FORMAT = "shardflow.plan/v2"
# A plan with a table outside DEFAULT_MODULE: table entries carry ``module``. Only such plans are
# v3, so plans of specs without modules stay byte-identical and older readers refuse what they would
# misread.
PLAN_FORMAT_MODULES = "shardflow.plan/v3"
# A plan with a fused_uvm_caching table whose cache size the planner chose (other than its spec's or
# the cost model's caching_ratio): table entries carry ``cache_load_factor``; modules as in v3.
PLAN_FORMAT_CACHES = "shardflow.plan/v4"
# A plan whose sharding plan leaves a cache of TorchRec's default size unstated beside a cache the spec
# sizes otherwise (rec.cost.tables.implicit_caches); modules as in v3. Readers build the sharding plan of
# a v2-v4 plan as those were planned: every cache states its size where any table's differs.
PLAN_FORMAT_UNSTATED = "shardflow.plan/v5"
# A plan whose sharding plan states a cache's size only where a cache of another size shares its kernel
# group in the plan (rec.cost.tables.CacheRule.PLACED), where v4 or v5 would state more; a chosen cache
# size of TorchRec's default counts as none. Tables and modules as in v4. Readers build the sharding plan
# of a v4 plan with every cache stated, and of a v5 plan as v5 states them.
PLAN_FORMAT_PLACED = "shardflow.plan/v6"
PLAN_FORMAT_V1 = "shardflow.plan/v1"
PLAN_FORMATS = (PLAN_FORMAT_V1, PLAN_FORMAT, PLAN_FORMAT_MODULES, PLAN_FORMAT_CACHES,
                PLAN_FORMAT_UNSTATED, PLAN_FORMAT_PLACED)  # what readers accept

__all__ = [
    "PLAN_FORMAT",
    "PLAN_FORMATS",
    "PLAN_FORMAT_CACHES",
    "PLAN_FORMAT_MODULES",
    "PLAN_FORMAT_PLACED",
    "PLAN_FORMAT_UNSTATED",
    "PLAN_FORMAT_V1",
    "BoundMethod",
    "Movement",
    "Plan",
    "PlanMetrics",
    "Replicas",
    "Shard",
    "TablePlan",
]


@dataclass(frozen=True)
class Shard:
    rank: int
    offsets: tuple[int, int]  # [row, col]
    sizes: tuple[int, int]  # [rows, cols]


@dataclass(frozen=True)
class Replicas(Sequence[Shard]):
    """``world_size`` copies of ``replica``, the k-th on rank k (a data_parallel table)."""

    replica: Shard  # its rank is ignored
    world_size: int

    def __len__(self) -> int:
        return self.world_size

    @overload
    def __getitem__(self, i: int) -> Shard: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Shard]: ...
    def __getitem__(self, i: int | slice) -> Shard | Sequence[Shard]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.world_size))]
        k = range(self.world_size)[i]
        return Shard(k, self.replica.offsets, self.replica.sizes)

    def __iter__(self) -> Iterator[Shard]:
        return (Shard(k, self.replica.offsets, self.replica.sizes) for k in range(self.world_size))


@dataclass(frozen=True)
class TablePlan:
    name: str
    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    ranks: Sequence[int]  # of the shards, in order; range(world_size) for data_parallel
    shards: Sequence[Shard]  # a tuple, or Replicas for data_parallel
    perf: float  # estimated ms per iteration, summed over shards (TorchRec Perf.total)
    hbm: int  # estimated bytes, summed over shards
    ddr: int
    module: str = DEFAULT_MODULE  # the embedding module holding the table (its fully qualified name)
    # A fused_uvm_caching table's share of rows in its cache where the planner chose it; None: its
    # spec's cache_load_factor, else the cost model's caching_ratio raised to the spec's
    # min_cache_load_factor (rec.plan.load_factors).
    cache_load_factor: float | None = None

    @property
    def replicated(self) -> bool:
        return isinstance(self.shards, Replicas)

    @property
    def key(self) -> str:
        """The table's identity in the plan (``rec.spec.types.table_key``)."""
        return table_key(self.module, self.name)


@dataclass(frozen=True)
class Plan:
    """A plan as a value: every field typed, validated when read (``rec.plan.parse``)."""

    plan_id: str
    spec_hash: str  # what the plan says its spec hashes to (``spec.spec_hash`` when unedited)
    topology: Topology
    planner: PlannerIdentity  # the configuration the plan_id covers
    tables: Sequence[TablePlan]  # a tuple, or rec.plan.columns.TableColumns (built plans)
    metrics: PlanMetrics
    spec: Spec  # the tables the plan was made for, so a training job needs nothing else
    previous_plan_id: str | None = None  # the plan this one was replanned from (minimal movement)
    # Which caches its sharding plan states, as it was planned: a plan read from a format before v6 keeps
    # that format's rule where it states others (rec.cost.tables.implicit_caches).
    cache_rule: CacheRule = CacheRule.PLACED

    def table(self, key: str) -> TablePlan:
        """The table of ``key``: its name in the default module, ``module.name`` in another."""
        return self.tables[self.columns.keys.index(key)]

    @property
    def format(self) -> str:
        """The plan.json format this plan is written in."""
        c = self.columns
        chosen = c.load_factor is not None and not np.isnan(c.load_factor).all()
        # Readers of v4 state every cache of a plan that chose sizes; readers of v5 as v5 does.
        older = CacheRule.EVERY if chosen else CacheRule.GROUP
        if self.caches and self.cache_rule is CacheRule.PLACED and self.rules_differ(older):
            return PLAN_FORMAT_PLACED
        if chosen:
            return PLAN_FORMAT_CACHES
        if self.caches and self.cache_rule is not CacheRule.EVERY and self.rules_differ(
                CacheRule.EVERY, CacheRule.GROUP, caching_only=True):
            return PLAN_FORMAT_UNSTATED
        default = all(m == DEFAULT_MODULE for m in c.modules)
        return PLAN_FORMAT if default else PLAN_FORMAT_MODULES

    @property
    def caches(self) -> bool:
        """Whether some table takes fused_uvm_caching (else every rule states the same)."""
        return bool((self.columns.compute_kernel == CK_CODE[ComputeKernel.FUSED_UVM_CACHING]).any())

    def rules_differ(self, rule: CacheRule, than: CacheRule | None = None, caching_only: bool = False) -> bool:
        """Whether ``rule`` leaves other caches without a size than ``than`` (default: the plan's own
        rule) for some table (each table's options are costed so), or with ``caching_only`` for some
        fused_uvm_caching table (rec.cost.tables.implicit_caches)."""
        from rec.plan.load_factors import plan_placement, unstated_caches

        differ = unstated_caches(self, rule) != unstated_caches(self, than)
        if caching_only:
            differ &= plan_placement(self).kernel == CK_CODE[ComputeKernel.FUSED_UVM_CACHING]
        return bool(differ.any())

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def spec_tables(self) -> tuple[dict[str, Any], ...]:
        """The spec's tables as plan.json's ``spec`` rows (``rec.spec.columns.table_to_row``)."""
        from rec.spec.columns import table_to_row

        return tuple(table_to_row(t) for t in self.spec.tables)

    @property
    def columns(self) -> TableColumns:
        """The tables as columns (``rec.plan.columns``)."""
        from rec.plan.columns import columns_of

        return columns_of(self.tables, self.world_size)

    def rows_per_rank(self) -> list[int]:
        """Embedding rows each rank holds (data_parallel counts every replica)."""
        import numpy as np

        c = self.columns
        every = c.table_of_entry
        replica = c.replicated[every]
        rows = np.bincount(c.rank[~replica], weights=c.rows[~replica], minlength=self.world_size)
        return [int(x) for x in rows + c.rows[replica].sum()]
