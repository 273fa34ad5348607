"""``shardflow measure`` and ``shardflow calibrate`` through the real CLI: real torchrun, gloo, two
ranks. One measurement (recorded in MLflow on a temporary SQLite store), one calibration whose
probes all time out, and the bad inputs that never start a process (a quick calibration whose
profile then plans: tests/bench/test_gpu_check.py, whose calibrate section runs one)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from flows.cli import main
from rec.plan import read_plan
from tests.flows.cli_in_process import shardflow_here
from tests.paths import CPU_2PROC, ROOT, SHARDFLOW, TWO_TOWER_SEQ

SCREEN_LINES = 40
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow


def shardflow(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SHARDFLOW_"))}
    return subprocess.run([str(SHARDFLOW), *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory):
    """A plan of three modules: two EmbeddingBagCollections and an EmbeddingCollection, whose sharded
    outputs (LazyAwaitables of a dict of JaggedTensors) the measuring job must tell apart."""
    out = tmp_path_factory.mktemp("plan")
    assert main(["plan", "--no-track", str(TWO_TOWER_SEQ), "--topology", str(CPU_2PROC), "--out", str(out),
                 "--no-chart"]) == 0
    return out


@pytest.mark.slow
def test_measure_writes_predicted_against_measured_per_rank_and_records_a_measure_run(plan_dir, tmp_path,
                                                                                    mlflow_uri, capfd):
    uri = mlflow_uri
    out = tmp_path / "m"
    r = shardflow("measure", "--plan", str(plan_dir), "--out", str(out), "--iterations", "4", "--warmup", "1",
                  "--tracking-uri", uri, "--state-dir", str(tmp_path / "state"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = json.loads((out / "measure.json").read_text())
    plan = read_plan(plan_dir)
    assert m["format"] == "shardflow.measure/v1" and m["plan_id"] == plan.plan_id
    assert m["predicted_ms"] == pytest.approx(list(plan.metrics.rank_perf), rel=1e-12)  # the default profile
    for key in ("predicted_ms", "measured_ms", "measured_p90_ms", "measured_fwd_ms", "measured_bwd_ms"):
        assert len(m[key]) == 2 and all(v > 0 for v in m[key]), key
    assert all(p50 <= p90 for p50, p90 in zip(m["measured_ms"], m["measured_p90_ms"], strict=True))
    assert m["critical_path_predicted"] == max(m["predicted_ms"])
    assert m["critical_path_measured"] == max(m["measured_ms"])
    assert m["error"] == pytest.approx(m["critical_path_measured"] / m["critical_path_predicted"] - 1)
    assert m["iterations"] == 4 and m["warmup"] == 1 and m["profile"]["default"] is True
    assert m["synthetic_batches"] == 4 and m["touched_over_cache"] is None  # no cache on cpu: the least pool
    assert m["machine"]["device"] == "cpu" and m["machine"]["world_size"] == 2
    assert "Traceback" not in r.stderr and len(r.stdout.splitlines()) <= SCREEN_LINES
    predicted = next(line for line in r.stdout.splitlines() if line.startswith("predicted "))
    measured = next(line for line in r.stdout.splitlines() if line.startswith("measured "))
    assert re.fullmatch(r"predicted +\d+\.\d{4} ms per iteration", predicted)  # TorchRec's defaults: no parts
    assert re.search(r"^measured +\d+\.\d{4} ms per iteration .*: \d+\.\d{3}x predicted$", measured)
    # TorchRec's default constants are named as the reason, with the command that measures this machine's.
    assert "TorchRec's default constants, not this machine's" in r.stdout and "shardflow calibrate" in r.stdout

    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow")
    (run,) = client.search_runs([experiment.experiment_id], "tags.`shardflow.step` = 'measure'")
    assert run.data.tags["shardflow.plan_id"] == plan.plan_id
    metrics = run.data.metrics
    # What the command printed is what the run logged, under one name each.
    assert f"{metrics['predicted_iteration_ms']:.4f} ms" in predicted
    assert f"{metrics['measured_iteration_ms']:.4f} ms" in measured
    assert f"{metrics['measured_over_predicted']:.3f}x" in measured
    assert metrics["measured_iteration_ms"] == pytest.approx(m["critical_path_measured"])
    assert metrics["measured_over_predicted"] == pytest.approx(m["error"] + 1)
    assert metrics["predicted_iteration_ms"] == pytest.approx(m["critical_path_predicted"])
    assert not {"critical_path_measured_ms", "critical_path_predicted_ms", "error", "measured_p90_ms"} & set(metrics)
    assert run.data.params["planner"] == "shardflow" and run.data.params["tables"] == str(len(plan.tables))
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["measure.json"]

    # No plan run (the plan was made by `shardflow plan`), yet compare lists the measurement with its plan.
    assert client.search_runs([experiment.experiment_id], "tags.`shardflow.step` = 'plan'") == []
    r = shardflow_here(capfd, "compare", "--wide", "--tracking-uri", uri, "--state-dir", str(tmp_path / "state"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (row,) = [line.split() for line in r.stdout.splitlines() if line.startswith(plan.plan_id)]
    assert row[1] == "shardflow" and "measure" in row and f"{metrics['measured_iteration_ms']:.2f}" in row


@pytest.mark.slow
def test_a_calibration_whose_probes_all_time_out_exits_2_and_writes_no_profile(tmp_path):
    profile = tmp_path / "cpu.yaml"
    r = shardflow("calibrate", "--topology", str(CPU_2PROC), "--out", str(profile), "--work", str(tmp_path / "w"),
                  "--quick", "--max-probes", "2", "--time-limit", "0.001", "--warmup", "1")
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Cannot fit a profile" in r.stderr and "timed out" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) <= SCREEN_LINES
    assert not profile.exists() and not (tmp_path / "cpu.fit.json").exists()


@pytest.mark.parametrize(("args", "expected"), [
    (["measure", "--plan", "{plan}", "--nproc-per-node", "3"], "3 processes, but the plan is for 2 ranks"),
    (["measure", "--plan", "{tmp}/nowhere"], "nowhere"),
    (["measure", "--plan", "{plan}", "--iterations", "0"], "--iterations"),
    (["measure", "--plan", "{plan}", "--time-limit", "0"], "--time-limit: must be above 0"),  # it could time nothing
    (["calibrate", "--topology", str(CPU_2PROC), "--out", "{tmp}/p.yaml", "--time-limit", "0"],
     "--time-limit: must be above 0"),
    (["calibrate", "--topology", str(CPU_2PROC), "--out", "{tmp}/p.txt"], "give a .yaml or .yml file name"),
    (["calibrate", "--topology", str(CPU_2PROC), "--out", "{tmp}/p.yaml", "--rounds", "0"], "--rounds"),
    (["calibrate", "--topology", "{tmp}/none.yaml", "--out", "{tmp}/p.yaml"], "none.yaml"),
    # every problem at once: the settings no longer hide the output's and the topology's
    (["calibrate", "--topology", "{tmp}/none.yaml", "--out", "{tmp}/nodir/p.yaml", "--rounds", "0"],
     "--rounds: must be at least 1"),
    (["calibrate", "--topology", "{tmp}/none.yaml", "--out", "{tmp}/nodir/p.yaml", "--rounds", "0"], "none.yaml"),
    (["calibrate", "--topology", "{tmp}/none.yaml", "--out", "{tmp}/nodir/p.yaml", "--rounds", "0"],
     "no directory"),
])
def test_bad_input_exits_2_with_one_message_before_any_process_starts(args, expected, plan_dir, tmp_path, capsys):
    argv = [a.format(plan=plan_dir, tmp=tmp_path) for a in args]
    assert main([*argv, "--work", str(tmp_path / "w")] if argv[0] == "calibrate" else [*argv, "--no-track"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "p.yaml").exists() and not (tmp_path / "w").exists()


@pytest.mark.slow
def test_a_second_calibration_into_the_same_profile_is_refused_while_the_first_runs(tmp_path):
    """Two `shardflow calibrate` into one file: the second exits 2 at once, naming the first; the
    first, stopped, leaves neither a profile nor a fit report."""
    import signal
    import time

    from rec.file_lock import file_lock

    profile = tmp_path / "cpu.yaml"
    # the full calibration (minutes), stopped below: a quick one could finish while the second starts
    args = ["calibrate", "--topology", str(CPU_2PROC), "--out", str(profile)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SHARDFLOW_"))}
    first = subprocess.Popen([str(SHARDFLOW), *args, "--work", str(tmp_path / "w1")], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the first holds the profile's lock
            try:
                with file_lock(tmp_path / ".cpu.yaml.lock", blocking=False):
                    pass
            except BlockingIOError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the first calibration never took the profile's lock")
        began = time.monotonic()
        second = shardflow(*args, "--work", str(tmp_path / "w2"))
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert "another shardflow calibrate is writing it" in second.stderr and "Traceback" not in second.stderr
        assert time.monotonic() - began < 30 and not (tmp_path / "w2" / "timings.json").exists()
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert not profile.exists() and not (tmp_path / "cpu.fit.json").exists()
