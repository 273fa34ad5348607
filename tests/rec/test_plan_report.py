"""What the CLI shows of a plan: the per-rank table and the compute/communication split."""

from __future__ import annotations

import numpy as np
import pytest

from rec.plan.breakdown import breakdown
from rec.plan.report import CRITICAL, TOP, rank_table
from rec.planning import plan_spec
from rec.spec import read_spec, spec_from_rows
from rec.spec.synthetic import criteo_1tb_spec, issue2282_spec
from rec.topology import read_topology
from rec.topology.validate import topology_from_dict
from tests.paths import ROOT


@pytest.fixture(scope="module")
def cpu_plan():
    return plan_spec(read_spec(ROOT / "examples/specs/cpu_demo.yaml"),
                     read_topology(ROOT / "examples/topologies/cpu_2proc.yaml"))


@pytest.fixture(scope="module")
def wide_plan():
    """Criteo's tables on 64 GPUs in 8 hosts: row-wise and column-wise shards, cross-host traffic."""
    topology = topology_from_dict({"world_size": 64, "local_world_size": 8, "compute_device": "cuda",
                                   "hbm_cap": "80GiB", "batch_size": 512})
    return plan_spec(criteo_1tb_spec(), topology)


def test_a_cpu_plan_shows_the_ddr_that_binds_and_marks_the_critical_rank(cpu_plan):
    table = rank_table(cpu_plan)
    assert "ddr_usable" in table.header and not any(h.startswith("hbm") for h in table.header)
    assert [r[0] for r in table.rows] == ["0", "1"]
    critical = int(np.argmax(cpu_plan.metrics.rank_perf))
    assert [r[-1] for r in table.rows] == [CRITICAL if r == critical else "" for r in range(2)]


def test_beyond_32_ranks_the_table_summarizes_and_all_ranks_shows_every_one(wide_plan):
    perf = np.asarray(wide_plan.metrics.rank_perf)
    table = rank_table(wide_plan)
    labels = [r[0] for r in table.rows if any(r)]
    assert labels[:3] == ["min", "median", "max"] and len(labels) == 3 + TOP
    assert float(table.rows[2][1]) == pytest.approx(perf.max(), abs=1e-4)
    busiest = [int(x) for x in labels[3:]]
    assert busiest[0] == int(np.argmax(perf)) and table.rows[4][-1] == CRITICAL
    assert "--all-ranks" in table.note
    assert len(rank_table(wide_plan, all_ranks=True).rows) == 64


@pytest.mark.parametrize("which", ["cpu_plan", "wide_plan", "issue2282", "cache_sizes"])
def test_compute_and_communication_add_up_to_the_plans_own_estimate_per_rank(which, request):
    if which == "issue2282":
        plan = plan_spec(issue2282_spec(200), read_topology(ROOT / "examples/topologies/h100_2x8.yaml"))
    elif which == "cache_sizes":  # tables 5x the HBM: the plan chooses its caches' sizes
        plan = plan_spec(spec_from_rows([{"name": f"t{i}", "num_embeddings": 10_000_000, "embedding_dim": 64,
                                          "pooling_factor": 4.0 + i} for i in range(4)]),
                         topology_from_dict({"world_size": 2, "compute_device": "cuda", "hbm_cap": "1GiB",
                                             "batch_size": 512}))
        assert any(t.cache_load_factor not in (None, 0.2) for t in plan.tables)
    else:
        plan = request.getfixturevalue(which)
    parts = breakdown(plan)
    total = parts.rank_compute() + parts.rank_comm()
    assert total == pytest.approx(np.asarray(plan.metrics.rank_perf), rel=1e-9)
    assert (parts.comm_ms >= -1e-12).all() and (parts.compute_ms > 0).all()
    # Every shard is somewhere: the entries cover each table's shards (a replica stands for all).
    for i, t in enumerate(plan.tables):
        assert (parts.table == i).sum() == (1 if t.replicated else len(t.shards))
    if which == "wide_plan":
        assert parts.comm_ms.sum() > 0  # 8 hosts: something crosses the network


def test_a_critical_path_a_rounding_below_its_bound_shows_a_gap_of_zero_not_minus_zero(cpu_plan):
    from dataclasses import replace

    from rec.analysis.plan_quality import quality_lines

    below = replace(cpu_plan, metrics=replace(cpu_plan.metrics, gap=-2e-16))
    (line,) = [line for line in quality_lines(below) if line.startswith("lower bound:")]
    assert " gap 0.00% " in line
