"""Turn a search result into a Plan."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from rec.cost.types import COMPUTE_KERNELS, SHARDING_TYPES, CostConfig
from rec.plan.identity import plan_id
from rec.plan.types import Plan, PlanMetrics, Shard, TablePlan
from rec.search.config import SearchConfig
from rec.search.result import SearchResult
from rec.spec.columns import table_to_row
from rec.spec.types import Spec
from rec.topology import topology_to_dict
from rec.topology.types import Topology


def planner_config(cost: CostConfig, search: SearchConfig) -> dict:
    """The search configuration the plan_id covers."""
    c = asdict(cost)
    c["optimizer"] = cost.optimizer.value
    return {"cost": c, "search": asdict(search)}


def build_plan(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
               search: SearchConfig, planning_s: float, extra_planner: dict | None = None) -> Plan:
    """``extra_planner`` (e.g. the number of search groups) joins the plan_id too."""
    space, a = result.space, result.assignment
    opts = space.options
    tables = []
    for t, spec_table in enumerate(spec.tables):
        o = int(a.choice[t])
        sl = opts.shards(o)
        shards = tuple(
            Shard(int(a.shard_rank[e]) + k,
                  (int(opts.row_offset[e] + k * opts.row_step[e]), int(opts.col_offset[e])),
                  (int(opts.rows[e]), int(opts.cols[e])))
            for e in range(sl.start, sl.stop) for k in range(int(opts.repeat[e])))
        tables.append(TablePlan(
            name=spec_table.name,
            sharding_type=SHARDING_TYPES[opts.sharding_type[o]],
            compute_kernel=COMPUTE_KERNELS[opts.compute_kernel[o]],
            ranks=tuple(s.rank for s in shards),
            shards=shards,
            perf=float((opts.perf[sl] * opts.repeat[sl]).sum()),
            hbm=int((opts.hbm[sl] * opts.repeat[sl]).sum()),
            ddr=int((opts.ddr[sl] * opts.repeat[sl]).sum()),
        ))
    metrics = PlanMetrics(
        critical_path=result.critical_path,
        lower_bound=result.bound.value,
        gap=result.gap,
        rank_perf=tuple(float(x) for x in a.loads),
        rank_hbm=tuple(int(x) for x in a.hbm),
        rank_ddr=tuple(int(x) for x in a.ddr),
        rank_hbm_cap=tuple(int(x) for x in space.hbm_cap),
        rank_ddr_cap=tuple(int(x) for x in space.ddr_cap),
        planning_s=round(planning_s, 4),
    )
    planner = {**planner_config(cost, search), **(extra_planner or {})}
    return Plan(
        plan_id=plan_id(spec.spec_hash, topology.topology_hash, planner),
        spec_hash=spec.spec_hash,
        topology=topology_to_dict(topology),
        planner=planner,
        tables=tuple(tables),
        metrics=metrics,
        spec_tables=tuple(table_to_row(t) for t in spec.tables),
    )


def rows_per_rank(plan: Plan, world_size: int) -> np.ndarray:
    """Embedding rows each rank holds (data_parallel counts every replica)."""
    rows = np.zeros(world_size, dtype=np.int64)
    for t in plan.tables:
        for s in t.shards:
            rows[s.rank] += s.sizes[0]
    return rows
