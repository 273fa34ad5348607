"""The exact stage: the MILP is the plan problem (brute force agrees), its plans are real plans
(TorchRec rates them as shardflow does), it improves plans and proves optimality, deterministically."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from rec.config.search import SearchConfig
from rec.search import build_search_space, search_result
from rec.search.bound import BoundMethod
from rec.search.exact import exact_tasks, model_options
from rec.search.heuristic import heuristic, prepare
from rec.search.milp import MilpLimits, build_model, solve
from rec.search.placement import Placement
from rec.search.space import SearchSpace
from rec.spec.synthetic import criteo_1tb_spec
from rec.spec.validate import spec_from_rows
from rec.topology import topology_from_dict
from tests.rec.search_instances import milp_optimum, random_space


def placements(space: SearchSpace, o: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every way to place option ``o``'s shards: (loads, hbm, ddr) per rank."""
    opts = space.options
    w, lws = space.world_size, space.local_world_size
    sl = opts.shards(o)
    perf, hbm, ddr, rep = opts.perf[sl], opts.hbm[sl], opts.ddr[sl], opts.repeat[sl]
    position = space.entry_position[sl]

    def at(ranks: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        load, h, d = np.zeros(w), np.zeros(w), np.zeros(w)
        for e, r in enumerate(ranks):
            for k in range(rep[e]):
                load[r + k] += perf[e]
                h[r + k] += hbm[e]
                d[r + k] += ddr[e]
        return load, h, d

    kind = space.placement[o]
    if kind == Placement.EVERY_RANK:
        return [at(list(position))]
    if kind == Placement.HOST_UNIFORM:
        return [at([h * lws + p for p in position]) for h in range(space.num_hosts)]
    if kind == Placement.FREE:
        return [at(list(r)) for r in itertools.product(range(w), repeat=len(position))]
    return [at(list(r)) for h in range(space.num_hosts)
            for r in itertools.product(range(h * lws, (h + 1) * lws), repeat=len(position))]


def brute_force(space: SearchSpace) -> float:
    """The least critical path over every option and every placement of every table."""
    per_table = []
    for t in range(space.num_tables):
        mine = np.flatnonzero((space.options.table == t) & space.feasible)
        per_table.append([p for o in mine for p in placements(space, int(o))])
    best = np.inf
    for combo in itertools.product(*per_table):
        load = np.sum([c[0] for c in combo], axis=0)
        if (sum(c[1] for c in combo) <= space.hbm_cap).all() and (sum(c[2] for c in combo) <= space.ddr_cap).all():
            best = min(best, float(load.max()))
    return best


def tiny_space(seed: int) -> SearchSpace:
    rng = np.random.default_rng(seed)
    cuda, hosts = seed % 2 == 0, 1 + (seed // 2) % 2
    rows = rng.integers(10_000, 3_000_000, 2)
    spec = spec_from_rows([{"name": f"t{i}", "num_embeddings": int(rows[i]), "embedding_dim": int(d),
                            "pooling_factor": float(rng.uniform(1, 10))}
                           for i, d in enumerate(rng.choice((32, 128, 256), 2))], source="tiny")
    need = int((rows.max() * 256 * 4 + rows.max() * 4) * rng.uniform(0.6, 1.5))
    caps = {"hbm_cap": need, "ddr_cap": "64GiB"} if cuda else {"hbm_cap": 0, "ddr_cap": 2 * need}
    topology = topology_from_dict({"world_size": 2 * hosts, "local_world_size": 2, "batch_size": 256,
                                   "compute_device": "cuda" if cuda else "cpu", **caps})
    return build_search_space(spec, topology)


@pytest.mark.parametrize("seed", range(8))
def test_milp_optimum_is_the_brute_force_optimum_on_tiny_problems(seed):
    space = tiny_space(seed)
    assert milp_optimum(space) == pytest.approx(brute_force(space), rel=1e-6)


def cuda(world: int, local: int, hbm: str, batch: int = 512):
    return topology_from_dict({"world_size": world, "local_world_size": local, "compute_device": "cuda",
                               "hbm_cap": hbm, "ddr_cap": "128GiB", "batch_size": batch})


def test_exact_stage_improves_criteo_1tb_on_8_ranks_and_proves_it_optimal():
    space = build_search_space(criteo_1tb_spec(), cuda(8, 8, "80GiB"))
    bound, ladder = prepare(space, SearchConfig())
    greedy = heuristic(space, ladder, SearchConfig(), bound).critical_path
    result = search_result(space)
    assert result.critical_path < 0.9 * greedy  # 0.0657 ms vs the heuristic's 0.0787
    assert result.optimal and result.bound.method is BoundMethod.MILP
    assert result.critical_path == pytest.approx(milp_optimum(space), rel=3e-6)
    assert result.bound.value > bound.value


def tight_spec(n: int, seed: int):
    """``n`` tables holding about 5x the HBM of the topologies below."""
    rng = np.random.default_rng(seed)
    return spec_from_rows([{"name": f"t{i}", "num_embeddings": int(10 ** rng.uniform(5.5, 6.8)),
                            "embedding_dim": int(rng.choice((32, 64, 128))),
                            "pooling_factor": float(np.round(rng.uniform(1, 30), 1))} for i in range(n)],
                          source=f"tight_spec({n}, {seed})")


def test_exact_stage_plans_are_deterministic_and_no_worse_than_the_heuristic():
    space = build_search_space(tight_spec(24, 1), cuda(8, 4, "2GiB", 1024))
    config = SearchConfig(time_limit_s=3)  # a small budget keeps the test quick
    bound, ladder = prepare(space, config)
    greedy = heuristic(space, ladder, config, bound)
    assert exact_tasks(space, greedy, bound, config)  # the stage runs here
    a, b = search_result(space, config), search_result(space, config)
    assert a.critical_path <= greedy.critical_path
    assert (a.assignment.hbm <= space.hbm_cap).all() and (a.assignment.ddr <= space.ddr_cap).all()
    if not (a.stats["exact_capped"] or b.stats["exact_capped"]):  # a loaded machine may hit the cap
        assert (a.assignment.choice == b.assignment.choice).all()
        assert (a.assignment.shard_rank == b.assignment.shard_rank).all()


def test_time_limit_zero_keeps_the_heuristic_plan():
    space = build_search_space(criteo_1tb_spec(), cuda(8, 8, "80GiB"))
    result = search_result(space, SearchConfig(time_limit_s=0))
    bound, ladder = prepare(space, SearchConfig())
    assert result.critical_path == heuristic(space, ladder, SearchConfig(), bound).critical_path
    assert result.bound.method is not BoundMethod.MILP and not result.optimal


def test_milp_model_skips_options_whose_largest_shard_cannot_improve_the_plan():
    space = random_space(2)
    cut = float(np.median(space.max_shard))
    kept = model_options(space, cut)
    assert (space.max_shard[kept] <= cut).all() and len(kept) < space.feasible.sum()


def test_highs_runs_print_nothing_and_report_how_they_ended_through_highspys_enums(capfd):
    space = random_space(2)
    options = model_options(space, np.inf)
    model = build_model(space, options, float(space.max_shard[options].max()), (0.0, np.inf))
    stopped = solve(model, MilpLimits(10**9, 0.0))
    proven = solve(model, MilpLimits(10**9, 120.0))
    assert capfd.readouterr().out == ""  # no banner, no log: the CLI's screen stays the CLI's
    assert stopped.capped and not stopped.optimal
    assert proven.optimal and not proven.capped and proven.values is not None


def test_the_highs_module_was_checked_with_the_installed_highspy():
    from importlib.metadata import version

    from rec.highs.instance import CHECKED_VERSION

    installed = version("highspy")
    assert installed == CHECKED_VERSION, (
        f"highspy {installed} is installed; rec/highs/instance.py was checked with {CHECKED_VERSION}. Check "
        "that highspy.Highs() still logs its banner only through enableCallbacks (QuietHighs; the test "
        "above shows whether anything is printed), that HighsModelStatus.kOptimal / kTimeLimit and "
        "SolutionStatus.kSolutionStatusFeasible still mean what run_status reads, then update CHECKED_VERSION")


torchrec = pytest.importorskip("torchrec")


@pytest.mark.parametrize("spec, topology, config", [
    (criteo_1tb_spec(), cuda(8, 8, "80GiB"), SearchConfig()),  # whole MILP, proven optimal
    # two hosts, memory-tight: neighbourhoods too, on a budget sized from 2 s (not the default 30)
    (tight_spec(24, 1), cuda(8, 4, "2GiB", 1024), SearchConfig(time_limit_s=2.0)),
])
def test_torchrec_rates_exact_stage_plans_as_shardflow_does(spec, topology, config):
    import logging

    from rec.planning import plan_spec
    from rec.torchrec.score import torchrec_score

    logging.disable(logging.WARNING)
    try:
        plan = plan_spec(spec, topology, config=config)
        score = torchrec_score(plan, spec, topology)
    finally:
        logging.disable(logging.NOTSET)
    assert score.critical_path == pytest.approx(plan.metrics.critical_path, rel=1e-9)
    assert score.over_capacity == ()


def test_the_neighbourhood_search_solves_no_milp_twice_from_one_incumbent(monkeypatch):
    """On 4 ranks the steps' partners run out: a step whose ranks were solved from the same incumbent
    would solve the same MILP to the same end again. Each is solved once; the plan only improves."""
    from rec.search import exact

    space = build_search_space(tight_spec(8, 3), cuda(4, 4, "2GiB", 1024))
    config = SearchConfig()
    bound, ladder = prepare(space, config)
    incumbent = heuristic(space, ladder, config, bound)
    solved: list[tuple[bytes, bytes]] = []

    def recorded(model, limits, start=None, options=None):
        solved.append((np.asarray(model.cost).tobytes() + np.asarray(model.col_upper).tobytes(),
                       np.asarray(start).tobytes()))
        return solve(model, limits, start, options)

    monkeypatch.setattr(exact, "solve", recorded)
    task = exact.ExactTask(exact.Strategy.NEIGHBOURHOODS, 30_000, 60.0)
    outcome = exact.run_task(space, task, incumbent, bound)
    assert len(solved) >= 3 and len(set(solved)) == len(solved)
    assert outcome.info["neighbourhood_steps"] > len(solved)  # steps whose MILP was solved already
    assert outcome.assignment is None or outcome.assignment.critical_path < incumbent.critical_path



def test_a_model_where_highs_root_reduced_cost_heuristic_loops_is_solved_within_its_limit():
    """HiGHS 1.16's root reduced-cost heuristic loops past any time limit on this model (the whole
    MILP of memory_tight_bench --third-shapes many_small-3308 from the start the cache-size pass gave
    it), keeping a core for good; with the options every search run uses it is solved at once."""
    import highspy

    from rec.highs.instance import quiet_highs, run_status, run_within
    from rec.search.milp import highs_options

    here = Path(__file__).parent / "highs_loop"
    h = quiet_highs()
    for name, value in highs_options(MilpLimits(nodes=100_000, seconds=5.0)):
        h.setOptionValue(name, value)
    h.readModel(str(here / "model.mps.gz"))
    ones = [int(c) for c in (here / "start.txt").read_text().splitlines()[1].split()]
    start = np.zeros(h.getNumCol())
    start[ones] = 1.0
    sol = highspy.HighsSolution()
    sol.col_value, sol.value_valid = start.tolist(), True
    h.setSolution(sol)
    assert run_within(h, 15.0), "HiGHS ran past its time limit"
    assert run_status(h).optimal
