"""A plan's claims checked against its shards: every estimate recomputed with its own cost model.

A plan read back (from the plan cache, ``--plan``, ``--previous``, MLflow) says what it costs:
each table's ``est`` and ``metrics`` (per-rank time and memory, the ranks' capacities, the
critical path, the lower bound, the gap, ``optimal``). None of it is taken on trust: the spec rows,
topology and cost configuration the plan carries (themselves checked against its plan_id) give
the cost model's options; each table's shards must be exactly those of its option, and their
estimates are summed again. Sums of floats are compared within ``PERF_RTOL`` (the search adds and
removes shard times in another order), bytes exactly. The lower bound is recomputed where it needs
no solver; a bound proven by the MILP must lie between that bound and the critical path.
``metrics.movement`` needs the previous plan and is not recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rec.errors import InputError, Problem
from rec.plan.load_factors import chosen_load_factors, unstated_caches
from rec.plan.metrics import UNKNOWN_BOUND, BoundMethod
from rec.plan.types import Plan

if TYPE_CHECKING:
    from rec.search.bound import LowerBound

# Relative: how far the times a plan records may be from the same times summed again here. Looser
# than one sum's float noise (rec.tolerance.TIME_NOISE): the search keeps each rank's load by
# adding and removing shard times over thousands of steps, and the check must pass every honest plan
# (docs/plan-format.md states this value).
PERF_RTOL = 1e-9
MAX_TABLE_PROBLEMS = 5  # tables named one by one before the rest are counted


@dataclass(frozen=True)
class Estimates:
    """What a plan's shards cost under its own cost model."""

    table_perf: np.ndarray  # (T,) ms, as the plan's tables' ``est``
    table_hbm: np.ndarray  # (T,) bytes
    table_ddr: np.ndarray
    rank_perf: np.ndarray  # (W,) ms
    rank_hbm: np.ndarray  # (W,) bytes
    rank_ddr: np.ndarray
    rank_hbm_cap: np.ndarray  # (W,) bytes left after the storage reservation
    rank_ddr_cap: np.ndarray
    bound: LowerBound  # the lower bound that needs no solver

    @property
    def critical_path(self) -> float:
        return float(self.rank_perf.max()) if len(self.rank_perf) else 0.0


def recompute(plan: Plan, fetches: bool = True) -> Estimates:
    """The estimates of a sound plan's shards (``validate_plan`` without problems); InputError if
    its spec, topology or cost model cannot be rebuilt or a table's shards are not those the cost
    model lays out for its sharding type and kernel. ``fetches`` False: as the cost model did before it
    priced the rows a cache with statistics fetches (TorchRec's prefetch_compute)."""
    from rec.search import build_search_space
    from rec.search.bound import lower_bound

    title = f"Cannot recompute the estimates of plan {plan.plan_id}:"
    plan = replace(plan, tables=plan.columns)  # the columns once (a plan read back holds objects)
    spec = plan.spec
    if not fetches:  # without the distinct ids of a batch, a table's cache fetches are not priced
        spec = replace(spec, tables=tuple(replace(t, distinct_per_batch=None) for t in spec.tables))
    try:
        # the plan's own cost model, with the cache sizes it chose
        space = build_search_space(spec, plan.topology, plan.planner.cost, chosen_load_factors(plan),
                                   unstated=unstated_caches(plan))
    except InputError as e:
        raise InputError(title, [Problem(f"plan {plan.plan_id}", "its spec, topology or cost model cannot be "
                                                                 f"rebuilt: {e.problems[0]}")]) from None
    index = {t.key: i for i, t in enumerate(spec.tables)}
    problems, costs = _shard_costs(plan, space.options, index)
    if problems:
        raise InputError(title, problems)
    return Estimates(**costs, rank_hbm_cap=space.hbm_cap, rank_ddr_cap=space.ddr_cap, bound=lower_bound(space))


def metrics_problems(plan: Plan, earlier_cost_models: bool = True) -> list[Problem]:
    """What the plan claims and its shards do not give; empty when every estimate holds (under today's
    cost model, or where ``earlier_cost_models``, under one a plan of its kind may have been made
    with). Expects a sound plan (``validate_plan`` without problems)."""
    try:
        claimed = _claimed(plan)
    except ValueError as e:
        return [Problem(f"plan {plan.plan_id} metrics", str(e))]
    plan = replace(plan, tables=plan.columns)  # the columns once (a plan read back holds objects)
    problems = _estimate_problems(plan, claimed, fetches=True)
    if problems and earlier_cost_models and _fetches_priced(plan):
        # A plan made before cache fetches were priced (no plan records its cost model's version):
        # its estimates hold under the cost model it was made with.
        return [] if not _estimate_problems(plan, claimed, fetches=False) else problems
    return problems


def _estimate_problems(plan: Plan, claimed: dict[str, np.ndarray], fetches: bool) -> list[Problem]:
    try:
        est = recompute(plan, fetches)
    except InputError as e:
        return list(e.problems)
    problems = _table_problems(plan, est) + _rank_problems(plan, est, claimed)
    return problems or _bound_problems(plan, est.bound)


def _fetches_priced(plan: Plan) -> bool:
    """Whether the plan may have been made before the cost model priced cache fetches: a table has
    the statistics whose fetches it prices, and the plan is of a format older than those fetches
    (v5 and v6 came after)."""
    from rec.cost.tables import global_distinct
    from rec.plan.types import PLAN_FORMAT_PLACED, PLAN_FORMAT_UNSTATED

    topology = plan.topology
    return (plan.format not in (PLAN_FORMAT_UNSTATED, PLAN_FORMAT_PLACED)
            and bool(global_distinct(plan.spec, topology.batch_size * topology.world_size).any()))


def _claimed(plan: Plan) -> dict[str, np.ndarray]:
    """The metrics' per-rank arrays (ms as floats, bytes as integers); ValueError unless each has
    world_size values (a plan read back has them: ``rec.plan.parse``; one built in memory may not)."""
    m, world = plan.metrics, plan.world_size
    out = {}
    for name in ("rank_perf", "rank_hbm", "rank_ddr", "rank_hbm_cap", "rank_ddr_cap"):
        values = getattr(m, name)
        if len(values) != world:
            what = "numbers" if name == "rank_perf" else "integers (bytes)"
            raise ValueError(f"{name} must list {world} {what}, one per rank")
        out[name] = np.asarray(values, dtype=np.float64 if name == "rank_perf" else np.int64)
    return out


def _shard_costs(plan: Plan, options: Any, index: dict[str, int]) -> tuple[list[Problem], dict[str, np.ndarray]]:
    """Match every table to its option and every shard to the option's shard in the same place;
    problems name the tables whose shards the cost model does not lay out so."""
    c = plan.columns
    world = plan.world_size
    spec_pos = np.fromiter((index[key] for key in c.keys), np.int64, len(c))
    option, ok = options.find(spec_pos, c.sharding_type, c.compute_kernel)
    # Shards per table as the option lays them out (a replica stands for all; a run for ``repeat``).
    first, stop = options.shard_start[option], options.shard_start[option + 1]
    runs = stop - first
    run_total = np.concatenate(([0], np.cumsum(options.repeat, dtype=np.int64)))
    expected = np.where(c.replicated, runs, run_total[stop] - run_total[first])
    ok &= (expected == np.diff(c.shard_start)) & (~c.replicated | (runs == 1))
    bad = [Problem(f"table {c.keys[i]}", "its shards are not those the cost model lays out for its "
                                          "sharding type and kernel")
           for i in np.flatnonzero(~ok)]
    if bad:
        return _named(bad), {}
    # Every run of every table, then every shard of those runs, in the plan's table and shard order.
    run = np.repeat(first - np.concatenate(([0], np.cumsum(runs)[:-1])), runs) + np.arange(runs.sum())
    run_table = np.repeat(np.arange(len(c)), runs)
    per_run = np.where(c.replicated[run_table], 1, options.repeat[run].astype(np.int64))
    entry_run = np.repeat(run, per_run)
    k = np.arange(len(entry_run)) - np.repeat(np.cumsum(per_run) - per_run, per_run)
    same = ((options.row_offset[entry_run] + k * options.row_step[entry_run] == c.row_offset)
            & (options.col_offset[entry_run] == c.col_offset)
            & (options.rows[entry_run] == c.rows) & (options.cols[entry_run] == c.cols))
    matches = np.ones(len(c), bool)
    np.logical_and.at(matches, c.table_of_entry, same)
    bad = [Problem(f"table {c.keys[i]}", "its shards are not those the cost model lays out for its "
                                          "sharding type and kernel")
           for i in np.flatnonzero(~matches)]
    if bad:
        return _named(bad), {}
    # Per table: each run's estimate times its shards, as the plan was built (rec.analysis.build).
    times = options.repeat[run].astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(runs)[:-1]))
    table_perf = np.add.reduceat(options.perf[run] * times, starts)
    table_hbm = np.add.reduceat(options.hbm[run] * times, starts)
    table_ddr = np.add.reduceat(options.ddr[run] * times, starts)
    # Per rank: a placed shard on its rank, a replica on every rank.
    replica = c.replicated[c.table_of_entry]
    placed = np.flatnonzero(~replica)
    ranks = c.rank[placed]
    out = {"table_perf": table_perf, "table_hbm": table_hbm, "table_ddr": table_ddr}
    for name, values in (("rank_perf", options.perf), ("rank_hbm", options.hbm), ("rank_ddr", options.ddr)):
        v = values[entry_run]
        on = np.zeros(world, dtype=v.dtype)
        np.add.at(on, ranks, v[placed])
        out[name] = on + v[replica].sum()
    return [], out


def _named(problems: list[Problem]) -> list[Problem]:
    if len(problems) <= MAX_TABLE_PROBLEMS:
        return problems
    more = Problem(f"{len(problems) - MAX_TABLE_PROBLEMS} more tables", problems[0].reason)
    return [*problems[:MAX_TABLE_PROBLEMS], more]


def _close(claimed: np.ndarray, actual: np.ndarray) -> np.ndarray:
    scale = float(np.abs(actual).max()) if len(actual) else 0.0
    return np.asarray(np.abs(claimed - actual) <= PERF_RTOL * max(scale, 1e-300))


def _table_problems(plan: Plan, costs: Estimates) -> list[Problem]:
    c = plan.columns
    wrong = ~_close(c.perf, costs.table_perf) | (c.hbm != costs.table_hbm) | (c.ddr != costs.table_ddr)
    problems = []
    for i in np.flatnonzero(wrong):
        said, cost = _apart(c.perf[i], costs.table_perf[i])
        problems.append(Problem(f"table {c.keys[i]}", f"est says {said} ms, {c.hbm[i]:,} B HBM, {c.ddr[i]:,} B DDR; "
                                                      f"its shards cost {cost} ms, {costs.table_hbm[i]:,} B HBM, "
                                                      f"{costs.table_ddr[i]:,} B DDR"))
    return _named(problems)


def _apart(said: float, actual: float) -> tuple[str, str]:
    """Two times as a message shows them: to 6 digits, or every digit where those would look alike."""
    short = f"{said:.6g}", f"{actual:.6g}"
    return short if short[0] != short[1] else (repr(float(said)), repr(float(actual)))


def _rank_problems(plan: Plan, costs: Estimates, claimed: dict[str, np.ndarray]) -> list[Problem]:
    m = plan.metrics
    problems = []
    checks = (("rank_perf", costs.rank_perf, "ms"), ("rank_hbm", costs.rank_hbm, "B"),
              ("rank_ddr", costs.rank_ddr, "B"), ("rank_hbm_cap", costs.rank_hbm_cap, "B"),
              ("rank_ddr_cap", costs.rank_ddr_cap, "B"))
    for name, actual, unit in checks:
        said = claimed[name]
        wrong = ~_close(said, actual) if unit == "ms" else said != actual
        source = "the topology leaves" if name.endswith("_cap") else "its shards give"
        for r in np.flatnonzero(wrong)[:MAX_TABLE_PROBLEMS]:
            shown = ([f"{v} ms" for v in _apart(said[r], actual[r])] if unit == "ms"
                     else [f"{int(v):,} B" for v in (said[r], actual[r])])
            problems.append(Problem(f"rank {r}", f"metrics.{name} says {shown[0]}, {source} {shown[1]}"))
    busiest = costs.critical_path
    if not _close(np.array([m.critical_path]), np.array([busiest]))[0]:
        path, cost = _apart(m.critical_path, busiest)
        problems.append(Problem("metrics.critical_path", f"says {path} ms, the busiest rank's shards cost {cost} ms"))
    return problems


def _bound_problems(plan: Plan, cheap: LowerBound) -> list[Problem]:
    """The lower bound as far as it is recomputed without a solver; the gap and ``optimal`` from it."""
    from rec.search.exact import OPTIMALITY_TOLERANCE

    m = plan.metrics
    problems = []
    top = m.critical_path * (1 + OPTIMALITY_TOLERANCE) * (1 + PERF_RTOL)
    if not 0 <= m.lower_bound <= top:
        problems.append(Problem("metrics.lower_bound", f"{m.lower_bound:.6g} ms is no bound on the critical "
                                                       f"path {m.critical_path:.6g} ms"))
    elif m.bound_method != UNKNOWN_BOUND:  # v1 plans do not say how their bound was proven
        if m.bound_method is BoundMethod.MILP:
            if m.lower_bound < cheap.value * (1 - PERF_RTOL):
                problems.append(Problem("metrics.lower_bound", f"says {m.lower_bound:.6g} ms proven by the MILP, "
                                                               f"below the bound {cheap.value:.6g} ms it starts from"))
        elif m.bound_method != cheap.method or not _close(np.array([m.lower_bound]), np.array([cheap.value]))[0]:
            problems.append(Problem("metrics.lower_bound", f"says {m.lower_bound:.6g} ms ({m.bound_method}); "
                                                           f"recomputed: {cheap.value:.6g} ms ({cheap.method.value})"))
    gap = (m.critical_path - m.lower_bound) / m.lower_bound if m.lower_bound > 0 else 0.0
    if abs(m.gap - gap) > PERF_RTOL * max(abs(gap), 1.0):
        problems.append(Problem("metrics.gap", f"says {m.gap:.6g}, the critical path and bound give {gap:.6g}"))
    optimal = m.critical_path <= m.lower_bound * (1 + OPTIMALITY_TOLERANCE)
    if m.optimal != optimal and m.bound_method != UNKNOWN_BOUND:  # a v1 plan states no ``optimal``
        problems.append(Problem("metrics.optimal", f"says {str(m.optimal).lower()}, the critical path and bound "
                                                   f"give {str(optimal).lower()}"))
    return problems
