"""shardflow's plans rated by TorchRec itself: the same critical path, and no worse than TorchRec's planner."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rec.planning import plan_spec
from rec.spec.columns import table_to_row
from rec.spec.synthetic import issue2282_spec, mixed_spec
from rec.spec.validate import spec_from_rows
from rec.topology import read_topology, topology_from_dict

pytest.importorskip("torchrec")

from rec.torchrec.score import run_torchrec_planner, score_plan, torchrec_score
from tests.paths import H100


@pytest.fixture(autouse=True)
def quiet_torchrec():
    # TorchRec logs a warning per topology / reservation / unsharded table; noise here.
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def cuda(world: int, local: int, **kw):
    return topology_from_dict({"world_size": world, "local_world_size": local, "compute_device": "cuda",
                               "hbm_cap": "80GiB", **kw})


def small_mixed_spec():
    """mixed_spec's 3 huge tables, 8 medium (one with 3 features, one FP16) and 12 tiny ones."""
    tables = mixed_spec(0).tables
    keep = tables[:3] + tables[3:11] + tables[50:62]
    return spec_from_rows([table_to_row(t) for t in keep], source="small_mixed_spec")


def test_torchrec_rates_issue2282_plan_at_shardflows_critical_path():
    from rec.config.search import SearchConfig

    spec, topology = issue2282_spec(30), cuda(4, 4)
    plan = plan_spec(spec, topology, config=SearchConfig(time_limit_s=1.0))  # a rating: any plan will do
    assert score_plan(plan, spec, topology) == pytest.approx(plan.metrics.critical_path, rel=1e-9)


def test_torchrec_rates_mixed_plan_on_two_hosts_at_shardflows_critical_path_within_capacity():
    spec, topology = small_mixed_spec(), cuda(8, 4)
    plan = plan_spec(spec, topology)
    score = torchrec_score(plan, spec, topology)
    assert score.critical_path == pytest.approx(plan.metrics.critical_path, rel=1e-9)
    assert score.rank_perf == pytest.approx(plan.metrics.rank_perf, rel=1e-9)
    assert score.rank_hbm == plan.metrics.rank_hbm
    assert score.rank_hbm_cap == plan.metrics.rank_hbm_cap
    assert score.over_capacity == ()
    assert {t.sharding_type.value for t in plan.tables} - {"data_parallel", "table_wise"}  # not trivial


# Few tables: balance hinges on granularity (TorchRec's answer is all table_wise, evenly paired).
@pytest.mark.parametrize("n_tables, world", [(6, 4), (8, 4), (10, 4), (16, 8)])
def test_shardflow_critical_path_is_no_worse_than_torchrec_planner(n_tables, world):
    spec, topology = issue2282_spec(n_tables), cuda(world, world)
    plan = plan_spec(spec, topology)
    theirs = run_torchrec_planner(spec, topology)
    assert theirs.num_plans > 0
    assert score_plan(plan, spec, topology) <= theirs.critical_path * (1 + 1e-9)


def test_example_topology_scores_through_yaml():
    topology = read_topology(H100)
    spec = issue2282_spec(12, seed=3)
    plan = plan_spec(spec, topology)
    assert score_plan(plan, spec, topology) == pytest.approx(plan.metrics.critical_path, rel=1e-9)


def test_torchrec_plans_and_rates_a_model_of_several_modules_as_shardflow_does():
    """Two EBC towers and a sequence EC at nested paths: TorchRec's planner plans the same module tree
    (both sharders), rates shardflow's plan at shardflow's critical path, and finds none better."""
    rows = []
    for module, tower in (("towers.user.ebc", "u"), ("towers.item.ebc", "i")):
        rows += [dict(name=f"{tower}{i}", num_embeddings=10 ** (3 + i % 4), embedding_dim=32 * (1 + i % 3),
                      pooling_factor=1.0 + i, module=module) for i in range(5)]
    rows += [dict(name=f"s{i}", num_embeddings=10 ** (3 + i), embedding_dim=64, pooling="NONE",
                  pooling_factor=20.0 * (i + 1), module="sequence.encoder.ec") for i in range(4)]
    spec, topology = spec_from_rows(rows), cuda(4, 4)
    plan = plan_spec(spec, topology)
    score = torchrec_score(plan, spec, topology)
    assert score.critical_path == pytest.approx(plan.metrics.critical_path, rel=1e-9)
    assert score.rank_hbm == plan.metrics.rank_hbm and score.over_capacity == ()
    theirs = run_torchrec_planner(spec, topology)
    assert theirs.num_plans > 0
    assert score.critical_path <= theirs.critical_path * (1 + 1e-9)


def test_a_memory_tight_plan_with_cache_statistics_is_rated_by_torchrec_as_shardflow_rates_it():
    """Tables 4x the ranks' HBM, each with statistics counted at the global batch (TorchRec's
    CacheStatistics: a hit-rate curve and the distinct ids of a batch): TorchRec, given them, rates
    shardflow's plan, caches grown, at shardflow's critical path, its cache fetches priced, and
    no worse than what its default and dynamic-programming proposers find with the same statistics."""
    from torchrec.distributed.planner.proposers import DynamicProgrammingProposer

    rng = np.random.default_rng(5)
    topology = cuda(4, 4, hbm_cap="1GiB", batch_size=1024)
    global_batch = topology.batch_size * topology.world_size
    rows = []
    for i in range(12):
        alpha = rng.uniform(0.6, 1.3)  # Zipf ids: the hottest f of the rows serve about f ** (1 - alpha)
        rows.append(dict(name=f"t{i}", num_embeddings=int(10 ** rng.uniform(6, 7.2)),
                         embedding_dim=int(rng.choice((64, 128))), pooling_factor=float(rng.uniform(1, 20)),
                         hit_rate_curve=[[f, round(f ** max(0.05, 1 - alpha), 6)] for f in (0.01, 0.05, 0.2, 0.5)],
                         distinct_per_batch=float(rng.uniform(0.2, 0.9) * global_batch),
                         stats_batch_size=global_batch))
    spec = spec_from_rows(rows)
    assert sum(t.bytes for t in spec.tables) > 4 * topology.world_size * 1024**3
    plan = plan_spec(spec, topology)
    score = torchrec_score(plan, spec, topology)
    assert score.critical_path == pytest.approx(plan.metrics.critical_path, rel=1e-9)
    assert score.rank_perf == pytest.approx(plan.metrics.rank_perf, rel=1e-9)
    assert score.over_capacity == ()
    assert any(t.cache_load_factor is not None for t in plan.tables)  # caches sized by the plan
    unpriced = spec_from_rows([{**r, "stats_batch_size": global_batch + 1} for r in rows])  # not TorchRec's
    assert sum(score.rank_perf) > sum(torchrec_score(plan, unpriced, topology).rank_perf)  # fetches priced
    best = min(run_torchrec_planner(spec, topology).critical_path,
               run_torchrec_planner(spec, topology, proposer=DynamicProgrammingProposer()).critical_path)
    assert score.critical_path <= best * (1 + 1e-9)
