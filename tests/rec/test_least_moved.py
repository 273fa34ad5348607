"""The least-movement MILP against a brute force: on small replans it finds the plan within the
critical-path target that moves the fewest bytes, and never goes below the movement floor."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rec.config.cost import CostConfig
from rec.config.search import SearchConfig
from rec.planning import plan_spec
from rec.search import build_search_space, search_result
from rec.search.assignment import usage
from rec.search.least_moved import least_moved, movement_floor
from rec.search.warm import moved_bytes, previous_placement
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict

TOPOLOGY = topology_from_dict({"world_size": 3, "local_world_size": 3, "compute_device": "cuda",
                               "hbm_cap": "3GiB", "ddr_cap": "64GiB", "batch_size": 512})


def random_rows(rng: np.random.Generator, n: int) -> list[dict]:
    return [{"name": f"t{i}", "num_embeddings": int(rng.integers(1, 12)) * 500_000,
             "embedding_dim": int(rng.choice([32, 64, 128])), "pooling_factor": float(rng.integers(1, 20)),
             "sharding_types": ["table_wise"]} for i in range(n)]


def brute_force(space, prev, target: float) -> float:
    """Least moved bytes over every option and rank of every table, within target and memory."""
    opts = space.options
    per_table = [[(int(o), r) for o in np.flatnonzero((opts.table == t) & space.feasible)
                  for r in range(space.world_size)] for t in range(space.num_tables)]
    best = np.inf
    for pick in itertools.product(*per_table):
        choice = np.array([o for o, _ in pick], np.int64)
        shard_rank = np.full(len(opts.perf), -1, np.int32)
        for o, r in pick:
            shard_rank[opts.shard_start[o]] = r
        a = usage(space, choice, shard_rank)
        if a.critical_path <= target and (a.hbm <= space.hbm_cap).all() and (a.ddr <= space.ddr_cap).all():
            best = min(best, moved_bytes(space, a, prev))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_the_least_movement_milp_matches_a_brute_force_on_small_replans(seed):
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, 4)
    previous = plan_spec(spec_from_rows(rows), TOPOLOGY)
    rows[0] = {**rows[0], "num_embeddings": rows[0]["num_embeddings"] * 2}  # grown
    rows[1] = {**rows[1], "pooling_factor": rows[1]["pooling_factor"] * 3}  # heavier: the old plan unbalances
    spec = spec_from_rows(rows)
    space = build_search_space(spec, TOPOLOGY)
    fresh = search_result(space, SearchConfig()).assignment
    prev = previous_placement(space, spec, previous, CostConfig())
    target = 1.02 * fresh.critical_path
    exact = brute_force(space, prev, target)
    found = least_moved(space, prev, fresh, target, seconds=10)
    best = found if found is not None else fresh
    assert best.critical_path <= target * (1 + 1e-9)
    assert moved_bytes(space, best, prev) <= exact + 1e-6 * prev.table_bytes.sum()
    assert movement_floor(space, prev) <= exact + 1e-6
