"""The lower bound: never above the optimum (proven by HiGHS), memory-aware where memory binds
(equal to the LP relaxation), and no worse than before where it does not."""

from __future__ import annotations

import numpy as np
import pytest

from rec.search import build_search_space, search_result
from rec.search.bound import BoundMethod, lower_bound
from rec.search.space import SearchSpace
from rec.spec.synthetic import issue2282_spec
from rec.spec.validate import spec_from_rows
from rec.topology import topology_from_dict
from tests.rec.search_instances import GiB, milp_optimum, random_space

SEEDS = range(60)  # cpu and cuda, one and two hosts alternate with the seed


@pytest.mark.parametrize("seed", SEEDS)
def test_bound_never_exceeds_the_optimum_and_the_plan_is_within_one_percent_of_it(seed):
    space = random_space(seed)
    optimum = milp_optimum(space)
    result = search_result(space)
    assert lower_bound(space).value <= optimum * (1 + 1e-9)
    assert result.bound.value <= optimum * (1 + 1e-9)
    assert optimum * (1 - 1e-9) <= result.critical_path <= 1.01 * optimum
    assert not result.optimal or result.critical_path <= optimum * (1 + 1e-6)


def test_the_instances_cover_both_devices_host_counts_and_binding_memory():
    spaces = [random_space(s) for s in SEEDS]
    assert {s.hbm_cap.max() > 0 for s in spaces} == {True, False}  # cuda and cpu
    assert {s.num_hosts for s in spaces} == {1, 2}
    assert sum(lower_bound(s).method is BoundMethod.LAGRANGIAN for s in spaces) >= 10


def memory_tight_space(n: int, ranks: int, seed: int) -> SearchSpace:
    """``n`` tables holding about 5x the ranks' 4 GiB of HBM."""
    rng = np.random.default_rng(seed)
    rows = 10 ** rng.uniform(5, 7, n)
    dims = rng.choice((32, 64, 128), n)
    rows = np.rint(rows * 5 * ranks * 4 * GiB / (rows * dims * 4 + rows * 4).sum()).astype(int)
    spec = spec_from_rows([{"name": f"t{i}", "num_embeddings": int(rows[i]), "embedding_dim": int(dims[i]),
                            "pooling_factor": float(rng.uniform(1, 30))} for i in range(n)], source="tight")
    topology = topology_from_dict({"world_size": ranks, "local_world_size": ranks, "compute_device": "cuda",
                                   "hbm_cap": "4GiB", "ddr_cap": "128GiB", "batch_size": 2048})
    return build_search_space(spec, topology)


def lp_relaxation(space: SearchSpace) -> float:
    """The LP relaxation with the ranks' memory pooled, by bisection on the critical path z: the
    least total work of fractional options whose largest shard is <= z, within the memory, must
    fit W * z (HiGHS through scipy)."""
    from scipy.optimize import linprog

    opts = space.options
    hbm, ddr = opts.total(opts.hbm) / GiB, opts.total(opts.ddr) / GiB

    def feasible(z: float) -> bool:
        idx = np.flatnonzero(space.feasible & (space.max_shard <= z))
        if len(np.unique(opts.table[idx])) < space.num_tables:
            return False
        a_eq = np.zeros((space.num_tables, len(idx)))
        a_eq[opts.table[idx], np.arange(len(idx))] = 1
        r = linprog(space.work[idx], A_ub=np.vstack([hbm[idx], ddr[idx]]),
                    b_ub=[space.hbm_cap.sum() / GiB, space.ddr_cap.sum() / GiB],
                    A_eq=a_eq, b_eq=np.ones(space.num_tables), bounds=(0, 1), method="highs")
        return r.status == 0 and r.fun <= space.world_size * z

    lo, hi = 0.0, float(space.work.max())
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return hi


@pytest.mark.parametrize("n, ranks, seed", [(20, 4, 0), (30, 8, 1), (40, 8, 2)])
def test_where_memory_binds_the_bound_is_the_lp_relaxation(n, ranks, seed):
    space = memory_tight_space(n, ranks, seed)
    bound = lower_bound(space)
    assert bound.method is BoundMethod.LAGRANGIAN and bound.prices.hbm > 0
    assert bound.value == pytest.approx(lp_relaxation(space), rel=1e-6)
    assert bound.value > 3 * bound.average_work  # what the memory-blind bound reported


def test_where_memory_does_not_bind_the_bound_is_the_average_work_as_before(space_of):
    from rec.search.pricing import Prices
    from rec.topology import topology_from_dict

    topology = topology_from_dict({"world_size": 8, "local_world_size": 8, "compute_device": "cuda",
                                   "hbm_cap": "80GiB", "batch_size": 512})
    bound = lower_bound(build_search_space(issue2282_spec(200), topology))
    assert bound.method is BoundMethod.AVERAGE_WORK and bound.prices == Prices()
    assert bound.value == bound.average_work >= bound.largest_shard
