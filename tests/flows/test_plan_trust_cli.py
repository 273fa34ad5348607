"""The real CLI on plans read back and written over: an edited plan cache entry is searched again
with one line, a plan directory keeps only the new plan's files (and MLflow logs only those), and
a full disk during ``shardflow plan`` is one line, exit 1, with the earlier plan intact."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
from pathlib import Path

import pytest

from flows.cli import main
from rec.plan import write_plan
from rec.plan.io import plan_from_dict
from rec.planning import replan_spec
from tasks.ingest import ingest
from tasks.paths import plan_cache_dir
from tasks.search import SearchSettings, plan_key, search_plan
from tests.bytecode import without_bytecode
from tests.flows.cli_in_process import shardflow_here
from tests.paths import CPU_2PROC, DEMO, SHARDFLOW
from tests.rec.plan_edits import all_on_rank_0, chart_of, move_first_table


def shardflow(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(SHARDFLOW), *args], capture_output=True, text=True, cwd=cwd, timeout=300, **kwargs)


def earlier_replan(out: Path) -> None:
    """A replanned plan with its chart in ``out``: what a later plan there must not leave behind."""
    inputs = ingest(str(DEMO), str(CPU_2PROC))
    previous = search_plan(inputs).plan
    plan = replan_spec(inputs.spec, inputs.topology, previous, max_regress=0.5).plan
    write_plan(plan, out, extra=chart_of(plan))
    assert (out / "movement.parquet").exists() and (out / "rank_load.png").exists()


def test_plan_no_chart_over_an_earlier_replan_leaves_only_the_new_files(tmp_path, capfd):
    out = tmp_path / "plan"
    earlier_replan(out)
    r = shardflow_here(capfd, "plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out),
                       "--no-chart")
    assert r.returncode == 0, r.stderr
    # nothing else: no hidden lock or temporary file left beside the plan
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "shards.parquet"]
    assert r.stdout.splitlines()[-1] == f"wrote {out / 'plan.json'}, {out / 'shards.parquet'}"


def test_a_full_disk_during_plan_is_one_line_and_the_earlier_plan_survives(tmp_path):
    out = tmp_path / "plan"
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def file_size_limit() -> None:  # the child's files stop at 2 KiB: EFBIG, as a full disk gives ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    # Another plan (a shorter exact stage), so that every file would change.
    r = shardflow("plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out), "--time-limit", "0",
                  cwd=tmp_path, preexec_fn=file_size_limit, env=without_bytecode())
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and str(out) in r.stderr and "File too large" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert [p.name for p in out.iterdir() if p.name.startswith(".tmp-plan-")] == []


@pytest.mark.slow
def test_run_plan_only_searches_an_edited_cache_entry_again_and_logs_only_the_new_files(tmp_path, prefect_api,
                                                                                         mlflow_uri):
    import mlflow

    state, out, uri = tmp_path / "state", tmp_path / "out", mlflow_uri
    inputs = ingest(str(DEMO), str(CPU_2PROC))
    searched = search_plan(inputs, SearchSettings(), plan_cache_dir(str(state)))  # what run would cache
    key = plan_key(inputs, SearchSettings())
    entry = Path(plan_cache_dir(str(state)), key)
    true_plan = (entry / "plan.json").read_bytes()
    earlier_replan(out / "plan")  # --out held another plan, with a chart and movement.parquet
    run = ("run", str(DEMO), "--topology", str(CPU_2PROC), "--plan-only", "--no-chart", "--out", str(out),
           "--state-dir", str(state), "--tracking-uri", uri)
    line = f"plan cache: entry {key} does not match its inputs"
    on_test_server = {**os.environ, "PREFECT_API_URL": prefect_api}

    # 1. A table moved to the other rank, metrics left alone.
    (entry / "plan.json").write_text(json.dumps(move_first_table(json.loads(true_plan))))
    r = shardflow(*run, cwd=tmp_path, env=on_test_server)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(line) == 1 and "searched again" in r.stderr, r.stderr
    assert "searched)" in r.stdout and "from the cache" not in r.stdout
    assert (out / "plan" / "plan.json").read_bytes() == true_plan
    assert sorted(p.name for p in (out / "plan").iterdir() if not p.name.startswith(".")) == \
        ["plan.json", "shards.parquet"]
    client = mlflow.MlflowClient(uri)
    (plan_run,) = client.search_runs([client.get_experiment_by_name("shardflow").experiment_id])
    assert sorted(a.path for a in client.list_artifacts(plan_run.info.run_id)) == ["plan.json", "shards.parquet"]

    # 2. Every table on rank 0 with the metrics made to match: sound and true, but not what the search gave.
    forged = all_on_rank_0(json.loads((entry / "plan.json").read_text()))
    assert plan_from_dict(forged).metrics.critical_path > 1.5 * searched.plan.metrics.critical_path
    (entry / "plan.json").write_text(json.dumps(forged))
    r = shardflow(*run, cwd=tmp_path, env=on_test_server)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(line) == 1 and "searched)" in r.stdout, r.stderr
    assert (out / "plan" / "plan.json").read_bytes() == true_plan
    assert (entry / "plan.json").read_bytes() == true_plan  # the entry is what the search gives again
