"""Turn a search result into a Plan."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from rec.cost.types import COMPUTE_KERNELS, SHARDING_TYPES, CostConfig
from rec.plan.identity import plan_id
from rec.search.assignment import chosen_shards
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
    choice = a.choice
    entries = chosen_shards(space, choice)
    per_table = opts.shard_start[choice + 1] - opts.shard_start[choice]
    # Expand runs to one row per shard, then build the Python objects from plain lists.
    rep = opts.repeat[entries].astype(np.int64)
    run = np.repeat(np.arange(len(entries)), rep)
    k = np.arange(len(run)) - np.repeat(np.cumsum(rep) - rep, rep)
    e = entries[run]
    rank = (a.shard_rank[e] + k).tolist()
    row_off = (opts.row_offset[e] + k * opts.row_step[e]).tolist()
    col_off, rows, cols = opts.col_offset[e].tolist(), opts.rows[e].tolist(), opts.cols[e].tolist()
    shards_per_table = np.add.reduceat(rep, np.concatenate(([0], np.cumsum(per_table)[:-1]))).tolist()
    starts = np.concatenate(([0], np.cumsum(per_table)[:-1]))
    perf = np.add.reduceat(opts.perf[entries] * rep, starts).tolist()
    hbm = np.add.reduceat(opts.hbm[entries] * rep, starts).tolist()
    ddr = np.add.reduceat(opts.ddr[entries] * rep, starts).tolist()
    tables, i = [], 0
    for t, spec_table in enumerate(spec.tables):
        n = shards_per_table[t]
        shards = tuple(Shard(rank[j], (row_off[j], col_off[j]), (rows[j], cols[j])) for j in range(i, i + n))
        i += n
        o = choice[t]
        tables.append(TablePlan(
            name=spec_table.name,
            sharding_type=SHARDING_TYPES[opts.sharding_type[o]],
            compute_kernel=COMPUTE_KERNELS[opts.compute_kernel[o]],
            ranks=tuple(rank[i - n:i]),
            shards=shards,
            perf=perf[t],
            hbm=int(hbm[t]),
            ddr=int(ddr[t]),
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
