"""Turn a search result into a Plan."""

from __future__ import annotations

import numpy as np

from rec.config.cost import CostConfig
from rec.config.planner_identity import PlannerIdentity
from rec.config.search import SearchConfig
from rec.plan.columns import TableColumns
from rec.plan.plan_id import plan_id, planner_config
from rec.plan.types import Plan, PlanMetrics
from rec.search.assignment import chosen_shards
from rec.search.placed_caches import with_placed_caches
from rec.search.result import SearchResult
from rec.sharding import ST_CODE, ShardingType
from rec.spec.types import Spec
from rec.topology.types import Topology


def build_plan(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
               search: SearchConfig, extra_planner: PlannerIdentity | None = None) -> Plan:
    """``extra_planner`` (how the search ran, a replan: ``rec.plan.plan_id``) joins the plan_id too.
    The caches its ShardingPlan gives no size are costed so first (``rec.search.placed_caches``)."""
    result = with_placed_caches(result, spec, topology, cost)
    space, a = result.space, result.assignment
    opts = space.options
    choice = a.choice
    world = topology.world_size
    entries = chosen_shards(space, choice)
    per_table = opts.shard_start[choice + 1] - opts.shard_start[choice]
    starts = np.concatenate(([0], np.cumsum(per_table)[:-1]))
    rep = opts.repeat[entries].astype(np.int64)
    replicated = opts.sharding_type[choice] == ST_CODE[ShardingType.DATA_PARALLEL]
    # Expand the runs of the other tables to one entry per shard; a replica run stays one entry.
    expand = np.where(np.repeat(replicated, per_table), 1, rep)
    run = np.repeat(np.arange(len(entries)), expand)
    k = np.arange(len(run)) - np.repeat(np.cumsum(expand) - expand, expand)
    e = entries[run]
    tables = TableColumns(
        names=tuple(t.name for t in spec.tables),
        sharding_type=opts.sharding_type[choice].astype(np.int8),
        compute_kernel=opts.compute_kernel[choice].astype(np.int8),
        perf=np.add.reduceat(opts.perf[entries] * rep, starts).astype(np.float64),
        hbm=np.add.reduceat(opts.hbm[entries] * rep, starts).astype(np.int64),
        ddr=np.add.reduceat(opts.ddr[entries] * rep, starts).astype(np.int64),
        replicated=replicated,
        shard_start=np.concatenate(([0], np.cumsum(np.add.reduceat(expand, starts)))).astype(np.int64),
        rank=(a.shard_rank[e] + k).astype(np.int64),
        row_offset=(opts.row_offset[e] + k * opts.row_step[e]).astype(np.int64),
        col_offset=opts.col_offset[e].astype(np.int64),
        rows=opts.rows[e].astype(np.int64),
        cols=opts.cols[e].astype(np.int64),
        world_size=world,
        modules=tuple(t.module for t in spec.tables),
        # the sizes chosen for tables that got fused_uvm_caching (rec.search.placed_caches dropped the others)
        load_factor=np.full(len(spec.tables), np.nan) if space.chosen_load_factor is None
        else space.chosen_load_factor.copy(),
    )
    metrics = PlanMetrics(
        critical_path=result.critical_path,
        lower_bound=result.bound.value,
        gap=result.gap,
        rank_perf=tuple(float(x) for x in a.loads),
        rank_hbm=tuple(int(x) for x in a.hbm),
        rank_ddr=tuple(int(x) for x in a.ddr),
        rank_hbm_cap=tuple(int(x) for x in space.hbm_cap),
        rank_ddr_cap=tuple(int(x) for x in space.ddr_cap),
        bound_method=result.bound.method,
        optimal=result.optimal,
    )
    planner = planner_config(cost, search, extra_planner)
    return Plan(
        plan_id=plan_id(spec.spec_hash, topology.topology_hash, planner),
        spec_hash=spec.spec_hash,
        topology=topology,
        planner=planner,
        tables=tables,
        metrics=metrics,
        spec=spec,
    )

