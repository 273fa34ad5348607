"""The Plan type: what every table becomes and what it costs (``plan.json``, format v1)."""

from __future__ import annotations

from dataclasses import dataclass

from rec.sharding import ComputeKernel, ShardingType

PLAN_FORMAT = "shardflow.plan/v1"


@dataclass(frozen=True)
class Shard:
    rank: int
    offsets: tuple[int, int]  # [row, col]
    sizes: tuple[int, int]  # [rows, cols]


@dataclass(frozen=True)
class TablePlan:
    name: str
    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    ranks: tuple[int, ...]
    shards: tuple[Shard, ...]
    perf: float  # estimated ms per iteration, summed over shards (TorchRec Perf.total)
    hbm: int  # estimated bytes, summed over shards
    ddr: int


@dataclass(frozen=True)
class PlanMetrics:
    critical_path: float
    lower_bound: float
    gap: float
    rank_perf: tuple[float, ...]
    rank_hbm: tuple[int, ...]
    rank_ddr: tuple[int, ...]
    rank_hbm_cap: tuple[int, ...]
    rank_ddr_cap: tuple[int, ...]
    planning_s: float


@dataclass(frozen=True)
class Plan:
    plan_id: str
    spec_hash: str
    topology: dict  # the normalized topology (DESIGN.md keys)
    planner: dict  # cost and search configuration the plan_id covers
    tables: tuple[TablePlan, ...]
    metrics: PlanMetrics
    # The spec rows the plan was made for, so a training job needs nothing else.
    spec_tables: tuple[dict, ...] = ()

    def table(self, name: str) -> TablePlan:
        return next(t for t in self.tables if t.name == name)
