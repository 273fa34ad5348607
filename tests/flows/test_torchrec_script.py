"""TorchRec scripts with shardflow: ``ShardflowPlanner.collective_plan`` under torchrun on 2 gloo
ranks (examples/torchrec_planner.py), and ``shardflow plan --planner torchrec``: TorchRec's own
plan written as a shardflow plan that ``show`` and ``train`` take."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.paths import CPU_2PROC, DEMO, H100, ROOT, SHARDFLOW, TORCHRUN

EXAMPLE = "examples/torchrec_planner.py"


def run(temp: Path, *cmd: str | Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``cmd`` as a user runs it; torchrun's per-run directory (its default log directory) lands in ``temp``."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(temp)})


@pytest.mark.slow
def test_collective_plan_gives_both_ranks_the_same_plan_and_dmp_trains_with_it(tmp_path):
    from rec.analysis import check_plan
    from rec.plan import read_plan

    r = run(tmp_path, TORCHRUN, "--standalone", "--nproc-per-node", "2", EXAMPLE, "--out", tmp_path,
            "--plan-dir", tmp_path / "plan", "--iterations", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    plans = [json.loads((tmp_path / f"plan-{rank}.json").read_text()) for rank in (0, 1)]
    assert plans[0] == plans[1] and set(plans[0]) == {"user.ebc", "sequence.0.ec"}
    losses = [float(line.rsplit(" ", 1)[1]) for line in r.stdout.splitlines() if line.startswith("iteration ")]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert "constructed directly" not in r.stderr  # TorchRec 1.8's warning that such a job "will fail"
    written = read_plan(tmp_path / "plan")  # the same plan, for shardflow show / measure / train
    check_plan(written)
    assert {t.key: [t.sharding_type.value, t.compute_kernel.value, list(t.ranks)] for t in written.tables} == {
        f"{path}.{name}": value for path, tables in plans[0].items() for name, value in tables.items()}


@pytest.mark.slow
def test_a_plan_rank_0_cannot_make_fails_every_rank_at_once_with_its_reasons(tmp_path):
    started = time.perf_counter()
    r = run(tmp_path, TORCHRUN, "--standalone", "--nproc-per-node", "2", EXAMPLE, "--ddr-cap", "2000000", timeout=300)
    assert r.returncode != 0 and time.perf_counter() - started < 120  # no collective waits for a plan
    for rank in (0, 1):
        assert f"rank {rank}: The tables fit one by one but not all together" in r.stderr
    assert "user.ebc.user_id_table" in r.stderr
    # a setting the planner refuses when it is made: its one line, not the rank's traceback (torchrun
    # still prints its own of the rank's exit code)
    (tmp_path / "a_file").write_text("")
    r = run(tmp_path, TORCHRUN, "--standalone", "--nproc-per-node", "1", EXAMPLE, "--plan-dir", tmp_path / "a_file",
            timeout=300)
    assert r.returncode != 0 and f'{EXAMPLE}", line' not in r.stderr, r.stderr[-3000:]
    assert "rank 0: " in r.stderr and "exists and is not a directory" in r.stderr


def test_plan_with_planner_torchrec_writes_torchrecs_plan_rated_as_torchrec_rates_it(tmp_path, capsys):
    from flows.cli import main
    from rec.analysis import check_plan
    from rec.plan import read_plan
    from rec.spec import read_spec
    from rec.topology import read_topology
    from rec.torchrec.score import run_torchrec_planner

    assert main(["plan", "--no-track", str(DEMO), "--topology", str(H100), "--out", str(tmp_path / "trec"),
                 "--planner", "torchrec"]) == 0
    out = capsys.readouterr().out
    plan = read_plan(tmp_path / "trec")
    check_plan(plan)
    assert "planned by:    torchrec" in out and plan.planner.made_by.name == "torchrec"
    reported = run_torchrec_planner(read_spec(DEMO), read_topology(H100)).critical_path
    assert plan.metrics.critical_path == pytest.approx(reported, rel=1e-9)
    assert main(["show", str(tmp_path / "trec")]) == 0


def test_the_default_planner_writes_the_plan_it_always_wrote(tmp_path):
    from flows.cli import main

    assert main(["plan", "--no-track", str(DEMO), "--topology", str(H100), "--out", str(tmp_path / "a"),
                 "--no-chart"]) == 0
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(H100), "--out", str(tmp_path / "b"), "--no-chart",
                 "--planner", "shardflow"]) == 0
    for name in ("plan.json", "shards.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert "made_by" not in json.loads((tmp_path / "a" / "plan.json").read_text())["planner"]


def test_torchrecs_planner_cannot_replan_and_its_dp_proposer_needs_cuda(tmp_path, capsys):
    from flows.cli import main

    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "p")]) == 0
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "q"),
                 "--planner", "torchrec", "--previous", str(tmp_path / "p")]) == 2
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "q"),
                 "--planner", "torchrec-dp"]) == 2
    err = capsys.readouterr().err
    assert "--previous: --planner torchrec plans from scratch" in err and "cpu ranks" in err
    assert "Traceback" not in err and not (tmp_path / "q").exists()


@pytest.mark.slow
def test_shardflow_train_trains_with_torchrecs_plan(tmp_path):
    from flows.cli import main

    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "plan"),
                 "--planner", "torchrec"]) == 0
    r = run(tmp_path, SHARDFLOW, "train", "--no-track", "--plan", tmp_path / "plan", "--out", tmp_path / "train",
            "--iterations", "6", "--warmup", "1", "--batch-size", "32")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    metrics = json.loads((tmp_path / "train" / "train_metrics.json").read_text())
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert metrics["plan_id"] == plan["plan_id"]
    assert metrics["applied_sharding"] == {t["name"]: t["sharding_type"] for t in plan["tables"]}
