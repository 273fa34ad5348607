"""Small random plan problems (cpu and cuda, one and two hosts, memory often binding) and an exact
optimum for them, shared by the bound and MILP tests; a searcher that records its runs."""

from __future__ import annotations

import numpy as np

from rec.planning import LocalSearcher
from rec.search import build_search_space
from rec.search.exact import model_options
from rec.search.milp import MilpLimits, build_model, solve
from rec.search.space import SearchSpace
from rec.spec.validate import spec_from_rows
from rec.topology import topology_from_dict

GiB = 2**30


def random_space(seed: int) -> SearchSpace:
    """3-5 tables on 2 or 4 ranks; cuda instances hold 0.5-3x their HBM in tables, cpu ones fill
    30-80% of their DDR."""
    rng = np.random.default_rng(seed)
    cuda = seed % 2 == 0
    hosts = 1 + (seed // 2) % 2
    local = 2
    n = int(rng.integers(3, 6))
    rows = np.rint(10 ** rng.uniform(4, 6.5, n)).astype(int)
    dims = rng.choice((16, 32, 64, 128, 256), n)
    table_bytes = float((rows * dims * 4 + rows * 4).sum())
    spec = spec_from_rows([{"name": f"t{i}", "num_embeddings": int(rows[i]), "embedding_dim": int(dims[i]),
                            "pooling_factor": float(np.round(rng.uniform(1, 20), 1))} for i in range(n)],
                          source=f"random_space({seed})")
    world = hosts * local
    if cuda:
        hbm = max(table_bytes / rng.uniform(0.5, 3.0) / world, 1.2 * float((rows * dims * 4).max()) / 4)
        caps = {"hbm_cap": int(hbm / 0.85) + 64 * 2**20, "ddr_cap": "64GiB"}
    else:
        caps = {"hbm_cap": 0, "ddr_cap": int(max(table_bytes / rng.uniform(0.3, 0.8) / world,
                                                  1.5 * float((rows * dims * 4 + rows * 4).max())))}
    topology = topology_from_dict({"world_size": world, "local_world_size": local, "batch_size": 512,
                                   "compute_device": "cuda" if cuda else "cpu", **caps})
    return build_search_space(spec, topology)


def milp_optimum(space: SearchSpace) -> float:
    """The optimal critical path over the search space, proven by HiGHS (no limits)."""
    options = model_options(space, np.inf)
    scale = float(space.max_shard[options].max())
    out = solve(build_model(space, options, scale, (0.0, np.inf)), MilpLimits(10**9, 120.0))
    assert out.optimal, out.status
    return out.objective


class RecordingSearcher(LocalSearcher):
    """The local search, noting each run's time limit (what sizes it), its exact stage's wall-clock
    cap (None: its time limit) and the time that stage took."""

    def __init__(self) -> None:
        self.runs: list[tuple[float, float | None, float]] = []

    def search(self, space, config, start=None, wall_s=None):
        result = super().search(space, config, start, wall_s)
        self.runs.append((config.time_limit_s, wall_s, result.stats["exact_s"]))
        return result
