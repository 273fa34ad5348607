"""TorchRec's own planner's plan as a shardflow ``Plan``: ``shardflow plan --planner torchrec``.

TorchRec's ``EmbeddingShardingPlanner`` (its default proposers, or its ``DynamicProgrammingProposer``)
plans the spec's modules as ``rec.torchrec.score.run_torchrec_planner`` builds them; its best
plan becomes a shardflow plan rated by shardflow's cost model (TorchRec's, to the last bit), with
the same lower bound a shardflow plan gets, so ``show``, ``measure``, ``train`` and ``compare`` take
it as they take any plan. Its ``planner.made_by`` names the planner and how long it took.
Imports torch and torchrec.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from importlib import metadata

import numpy as np

from rec.analysis.build import build_plan
from rec.config.cost import CostConfig
from rec.config.planner_identity import Planner
from rec.config.search import SearchConfig
from rec.errors import InputError, Problem, ProblemList
from rec.plan.plan_id import made_by_keys, plan_id
from rec.plan.table_placement import TablePlacement
from rec.plan.types import Plan
from rec.profile import check_profile_for
from rec.search import build_search_space
from rec.search.assignment import Assignment, usage
from rec.search.bound import lower_bound
from rec.search.result import SearchResult
from rec.search.space import SearchSpace
from rec.sharding import CK_CODE, ST_CODE, ComputeDevice, ComputeKernel, ShardingType
from rec.spec.types import Spec
from rec.topology.types import Topology
from rec.torchrec.score import run_torchrec_planner


def torchrec_plan(spec: Spec, topology: Topology, cost: CostConfig = CostConfig(),
                  proposer: Planner = Planner.TORCHREC) -> Plan:
    """The plan TorchRec's ``EmbeddingShardingPlanner`` chooses for ``spec`` on ``topology``
    (``proposer``: ``TORCHREC`` its default proposers, ``TORCHREC_DP`` its DynamicProgrammingProposer),
    rated by shardflow's cost model under ``cost``. InputError when no plan fits."""
    if proposer is Planner.SHARDFLOW:
        raise ValueError("torchrec_plan runs TorchRec's planner; shardflow's search is rec.planning.plan_spec")
    if proposer is Planner.TORCHREC_DP and topology.compute_device is ComputeDevice.CPU:
        raise InputError("TorchRec's DynamicProgrammingProposer cannot plan for cpu ranks:", [Problem(
            "--planner torchrec-dp", "it bins the tables by the ranks' HBM, which cpu ranks do not have "
                                     "(ZeroDivisionError in TorchRec); use --planner torchrec on cpu")])
    check_profile_for(cost.profile, topology)
    space = build_search_space(spec, topology, cost)  # a table that cannot fit: named, before TorchRec runs
    run = _run(spec, topology, cost, proposer)
    result = SearchResult(space, _assignment(space, spec, run.chosen), lower_bound(space))
    plan = build_plan(result, spec, topology, cost, SearchConfig())
    # TorchRec's search has none of shardflow's knobs: the plan_id covers the cost model and the planner.
    made_by = made_by_keys(proposer, metadata.version("torchrec"), tuple(run.proposer.split(",")), run.seconds)
    planner = replace(plan.planner, search=None, made_by=made_by)
    return replace(plan, planner=planner, plan_id=plan_id(spec.spec_hash, topology.topology_hash, planner))


def _run(spec: Spec, topology: Topology, cost: CostConfig, proposer: Planner):  # type: ignore[no-untyped-def]
    from torchrec.distributed.planner.proposers import DynamicProgrammingProposer
    from torchrec.distributed.planner.types import PlannerError

    chosen = DynamicProgrammingProposer() if proposer is Planner.TORCHREC_DP else None
    # Its warnings are about how run_torchrec_planner builds its inputs, and a data_parallel table's
    # "Sharding spec not found" (it has none, by design) goes to the root logger: not for the user.
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return run_torchrec_planner(spec, topology, cost, proposer=chosen)
    except PlannerError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise InputError(f"TorchRec's planner ({proposer.value}) found no plan:",
                         [Problem("EmbeddingShardingPlanner", " ".join(lines))]) from None
    finally:
        logging.disable(disabled)


def _assignment(space: SearchSpace, spec: Spec, chosen: tuple[TablePlacement, ...]) -> Assignment:
    """TorchRec's choices as shardflow's option and shard ranks; InputError naming every table
    whose choice shardflow's cost model does not lay out the same way."""
    opts = space.options
    index = {t.key: i for i, t in enumerate(spec.tables)}
    option_of = {(int(t), int(s), int(k)): o for o, (t, s, k) in
                 enumerate(zip(opts.table, opts.sharding_type, opts.compute_kernel, strict=True))}
    choice = np.full(len(spec.tables), -1, np.int64)
    shard_rank = np.full(len(opts.perf), -1, np.int32)
    problems = ProblemList()
    for c in chosen:
        key = c.key
        t = index[key]
        try:
            code = (t, ST_CODE[ShardingType(c.sharding_type)], CK_CODE[ComputeKernel(c.compute_kernel)])
        except ValueError:
            code = (t, -1, -1)
        o = option_of.get(code)
        if o is None:
            problems.add(f"table {key}", f"TorchRec chose {c.sharding_type}/{c.compute_kernel}, which shardflow "
                                         "does not plan for it (docs/spec.md: what FBGEMM refuses at training time)")
            continue
        why = _place(opts, o, c, shard_rank)
        if why:
            problems.add(f"table {key}", why)
        choice[t] = o
    named = {p.where for p in problems.items}
    for t in np.flatnonzero(choice < 0).tolist():
        if f"table {spec.tables[t].key}" not in named:
            problems.add(f"table {spec.tables[t].key}", "TorchRec's plan does not place it")
    problems.raise_if_any("TorchRec's plan cannot be read as a shardflow plan:")
    return usage(space, choice, shard_rank)


def _place(opts, o: int, chosen: TablePlacement, shard_rank: np.ndarray) -> str | None:  # type: ignore[no-untyped-def]
    """Record the rank of each run of option ``o`` in ``shard_rank``; why not, if TorchRec's shards
    are not the option's, in order, each run on consecutive ranks."""
    shards = chosen.shards
    k = 0
    for e in range(int(opts.shard_start[o]), int(opts.shard_start[o + 1])):
        for j in range(int(opts.repeat[e])):
            if k >= len(shards):
                return f"TorchRec's plan has {len(shards)} shards, shardflow's cost model more"
            s = shards[k]
            expected = ((int(opts.row_offset[e] + j * opts.row_step[e]), int(opts.col_offset[e])),
                        (int(opts.rows[e]), int(opts.cols[e])))
            if (s.offsets, s.sizes) != expected:
                return f"shard {k} is at {list(s.offsets)} of size {list(s.sizes)}; shardflow lays it out " \
                       f"at {list(expected[0])} of size {list(expected[1])}"
            if j == 0:
                shard_rank[e] = s.rank
            elif s.rank != shard_rank[e] + j:
                return f"shard {k} is on rank {s.rank}, not {shard_rank[e] + j} as its sharding type places it"
            k += 1
    return None if k == len(shards) else f"TorchRec's plan has {len(shards)} shards, shardflow's cost model {k}"
