"""Comparing plans as a user sees it: ``shardflow compare`` lists every train and measure run, of
plans made by ``shardflow plan`` or by TorchRec's planner (``--planner torchrec``), labelled by
planner, with one predicted iteration time (the one ``plan`` prints) and one name per metric in
MLflow. Real MLflow on a temporary SQLite file; the measurements and the training are recorded
from their files (measure.json, train_metrics.json) as the commands record them, without starting
torchrun (tests/flows/test_measure.py measures for real)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest

from flows.cli import main
from rec.plan import read_plan
from rec.train.metrics import Resumed
from tests.paths import CPU_2PROC, DEMO
from tests.stores import store_from

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow

PROFILE = """name: cpu-test
extensions:
  iteration_ms: 2.5
  sharding_type_ms: {table_wise: 1.25, column_wise: 0.5, row_wise: 0.75, data_parallel: 0.25}
machine:
  device: cpu
"""
# The names a user sees in MLflow's compare view, on every train and measure run: one per fact.
PLAN_METRICS = {"predicted_iteration_ms", "plan_level_ms", "critical_path_ms", "lower_bound_ms", "gap_pct",
                "optimal"}
RETIRED = {"critical_path", "lower_bound", "gap", "moved_fraction", "predicted_critical_path_ms",
           "critical_path_predicted_ms", "critical_path_measured_ms", "error", "measured_p90_ms",
           "iteration_latency_ms", "iteration_latency_ms_measured", "iteration_latency_ms_p50", "loss"}


def cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Three plans of the demo made outside any flow, so MLflow has no plan run of them: by shardflow's
    search under a profile with plan-level terms, by shardflow's search, and by TorchRec's planner;
    each with what ``shardflow plan`` printed."""
    tmp = tmp_path_factory.mktemp("plans")
    (tmp / "cpu.yaml").write_text(PROFILE)
    made = {}
    for name, extra in (("profiled", ["--profile", str(tmp / "cpu.yaml")]), ("ours", []),
                        ("torchrec", ["--planner", "torchrec"])):
        code, printed = cli("plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp / name),
                            "--no-chart",
                            *extra)
        assert code == 0, printed
        made[name] = (tmp / name, printed)
    return made


def measured(plan_dir: Path, out: Path, ms: float):
    """A measurement of the plan as ``shardflow measure`` leaves it on node 0 (measure.json written),
    the slowest rank at ``ms`` per iteration."""
    from rec.profile.types import Machine
    from rec.sharding import ComputeDevice
    from rec.train.measure_report import measure_report, write_measure
    from rec.train.timings import PlanTimes, Status
    from tasks.measure import Measured, MeasureSettings
    from tasks.records import now_ms

    plan = read_plan(plan_dir)
    fwd = ((ms / 2,) * 4, (ms / 4,) * 4)
    times = PlanTimes(plan_path=str(plan_dir / "plan.json"), plan_id=plan.plan_id, status=Status.MEASURED,
                      warmup=1, fwd_ms=fwd, bwd_ms=fwd)
    report = measure_report(plan, times, Machine(ComputeDevice.CPU, device_name="test cpu", world_size=2,
                                                 local_world_size=2))
    out.mkdir()
    write_measure(out, report)
    return Measured(plan.plan_id, str(out), report, MeasureSettings(), 2, now_ms(), str(plan_dir / "plan.json"))


def trained(plan_dir: Path, out: Path, resume: Resumed | None = None):
    """A training of the plan as ``shardflow train`` leaves it (train_metrics.json, iterations.parquet)."""
    from rec.train.metrics import Iterations, LatencyStats, LossStats, TrainMetrics, read_metrics, write_metrics
    from tasks.records import now_ms
    from tasks.train import Trained, TrainSettings

    plan = read_plan(plan_dir)
    metrics = TrainMetrics(plan.plan_id, 2, 6, 2, 512, "sparse_dist", "dlrm", LatencyStats(9.0, 11.0, 12.0, 9.5),
                           LossStats(0.7, 0.5, 0.6), 2 * 512 / 9.5e-3, {}, 4 if resume else 0, resume=resume)
    write_metrics(out, metrics, Iterations.of_run(0, np.full(6, 9.0), np.full(6, 0.6), 2))
    return Trained(plan.plan_id, str(out), read_metrics(out), TrainSettings(),
                   2, 1, now_ms(), str(plan_dir / "plan.json"))


@pytest.fixture(scope="module")
def store(plans, tmp_path_factory, mlflow_template) -> tuple[str, str]:
    """A SQLite store holding a measure run of each plan and a train run of shardflow's; no plan run."""
    from tasks.measure_record import record_measure
    from tasks.recorder import record_training
    from tasks.tracking import TrackingSettings

    tmp = tmp_path_factory.mktemp("mlflow")
    uri, state = store_from(mlflow_template, tmp), str(tmp / "state")
    tracking = TrackingSettings(uri, state_dir=state).resolve()
    for i, (name, (plan_dir, _)) in enumerate(plans.items()):
        assert record_measure(tracking, measured(plan_dir, tmp / f"m-{name}", 6.0 + i)).run_id
    resume = Resumed(from_plan_id="0123456789abcdef", step=4, tables_restored=7, tables_resized=1,
                     tables_initialized=0)
    assert record_training(tracking, trained(plans["profiled"][0], tmp / "t", resume)).run_id
    return uri, state


def runs(uri: str, step: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow")
    assert experiment is not None
    return list(client.search_runs([experiment.experiment_id], f"tags.`shardflow.step` = '{step}'"))


def compare_rows(uri: str, state: str, *args: str) -> list[dict[str, str]]:
    from flows.commands.compare import HEADER

    code, printed = cli("compare", "--tracking-uri", uri, "--state-dir", state, "--wide", *args)
    assert code == 0, printed
    lines = printed.splitlines()
    assert lines[0].split() == list(HEADER)
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]  # the rule under the header: each column's width
    return [{name: line[a:b].strip() for name, (a, b) in zip(HEADER, spans, strict=True)}
            for line in lines[2:] if line.strip() and not line.startswith("FAILED")]


def test_compare_lists_the_measure_and_train_runs_of_plans_mlflow_has_no_plan_run_of_labelled_by_planner(
        plans, store):
    uri, state = store
    rows = compare_rows(uri, state)
    ids = {name: read_plan(plan_dir).plan_id for name, (plan_dir, _) in plans.items()}
    by_plan = {}
    for row in rows:
        by_plan.setdefault(row["plan_id"], []).append(row)
    assert set(by_plan) == set(ids.values())
    assert [(r["planner"], r["run"]) for r in by_plan[ids["torchrec"]]] == [("torchrec", "measure")]
    assert [(r["planner"], r["run"]) for r in by_plan[ids["ours"]]] == [("shardflow", "measure")]
    assert sorted(r["run"] for r in by_plan[ids["profiled"]]) == ["measure", "train"]
    for name, (plan_dir, _) in plans.items():
        predicted = read_plan(plan_dir)
        for row in by_plan[ids[name]]:
            assert (row["spec"], row["tables"], row["world"], row["batch"]) == ("-", "8", "2", "512")
            assert row["profile"] == ("cpu-test" if name == "profiled" else "default")
            assert float(row["pred_ms"]) > 0 and row["gap"] != "-" and row["p50/pred"].endswith("x")
            assert row["spec_hash"] == predicted.spec_hash  # found by --spec-hash, below
    measure_ms = {row["plan_id"]: float(row["p50_ms"]) for row in rows if row["run"] == "measure"}
    assert measure_ms == {ids["profiled"]: 6.0, ids["ours"]: 7.0, ids["torchrec"]: 8.0}
    # The newest runs' plan first: shardflow's profiled plan, trained last.
    assert rows[0]["plan_id"] == ids["profiled"]

    only = compare_rows(uri, state, "--spec-hash", read_plan(plans["ours"][0]).spec_hash, "--last", "1")
    assert {row["plan_id"] for row in only} == {ids["profiled"]}


def test_the_predicted_iteration_time_plan_prints_is_the_one_every_run_logs_with_its_parts(plans, store):
    uri, _ = store
    printed = plans["profiled"][1]
    line = next(line for line in printed.splitlines() if line.startswith("predicted:"))
    total, critical, terms = map(float, re.findall(r"(\d+\.\d{4}) ms", line))
    assert "per iteration = critical path" in line and "plan-level terms" in line
    assert total == pytest.approx(critical + terms, abs=2e-4) and terms > 0
    plan = read_plan(plans["profiled"][0])
    assert critical == round(plan.metrics.critical_path, 4)
    for step in ("measure", "train"):
        (run,) = [r for r in runs(uri, step) if r.data.tags["shardflow.plan_id"] == plan.plan_id]
        m = run.data.metrics
        assert round(m["predicted_iteration_ms"], 4) == total, step
        assert m["predicted_iteration_ms"] == m["critical_path_ms"] + m["plan_level_ms"]
        assert m["measured_over_predicted"] == m["measured_iteration_ms"] / m["predicted_iteration_ms"]
    # Under TorchRec's default profile the prediction is the critical path, printed without parts.
    default = next(line for line in plans["ours"][1].splitlines() if line.startswith("predicted:"))
    assert default.endswith("ms per iteration") and "=" not in default


def test_every_train_and_measure_run_carries_one_name_per_metric_and_the_plan_it_ran(store):
    uri, _ = store
    for run in runs(uri, "measure"):
        names = set(run.data.metrics)
        assert PLAN_METRICS | {"measured_iteration_ms", "measured_iteration_p90_ms", "measured_over_predicted",
                               "predicted_ms_rank1", "measured_ms_rank1"} <= names
        assert not names & RETIRED
        assert {"planner", "tables", "spec.hash", "topology.batch_size", "profile.name"} <= set(run.data.params)
        assert run.data.tags["shardflow.spec_hash"] == run.data.params["spec.hash"]
    (train,) = runs(uri, "train")
    names = set(train.data.metrics)
    assert PLAN_METRICS | {"measured_iteration_ms", "measured_iteration_p90_ms", "measured_iteration_p99_ms",
                           "measured_iteration_mean_ms", "measured_over_predicted", "samples_per_s"} <= names
    assert not names & RETIRED
    assert train.data.metrics["measured_iteration_ms"] == 9.0
    assert train.data.params["resumed_from_plan_id"] == "0123456789abcdef"

    from mlflow import MlflowClient

    history = MlflowClient(uri).get_metric_history(train.info.run_id, "per_iteration/latency_ms")
    assert [p.step for p in sorted(history, key=lambda p: p.step)] == list(range(6))


def test_the_compatibility_switch_logs_the_old_names_beside_todays(plans, tmp_path, monkeypatch):
    from tasks.measure_record import measure_record
    from tasks.records import train_record

    monkeypatch.setenv("SHARDFLOW_LEGACY_METRIC_NAMES", "1")
    record = measure_record(measured(plans["ours"][0], tmp_path / "m", 5.0))
    m = record.metrics
    assert m["critical_path_measured_ms"] == m["measured_iteration_ms"] == 5.0
    assert m["critical_path_predicted_ms"] == m["predicted_iteration_ms"]
    assert m["error"] == pytest.approx(m["measured_over_predicted"] - 1)
    assert m["gap"] == pytest.approx(m["gap_pct"] / 100) and m["critical_path"] == m["critical_path_ms"]
    record = train_record(trained(plans["ours"][0], tmp_path))
    assert record.metrics["iteration_latency_ms_p50"] == 9.0
    assert record.metrics["predicted_critical_path_ms"] == record.metrics["predicted_iteration_ms"]
    assert [step for step, _ in record.series["iteration_latency_ms_measured"]] == [2, 3, 4, 5]
    assert record.series["iteration_latency_ms"] == record.series["per_iteration/latency_ms"]


def test_a_run_that_names_its_spec_is_shown_with_it_where_one_plan_came_from_two_files():
    """A plan_id hashes the spec's content: the demo copied to serve_spec.yaml and served plans the same
    plan, and every train run of it was listed as serve_spec (the newest plan run's name), the pipeline
    run of cpu_demo.yaml too. A run's own spec name is its row's; a run without one takes its plan's."""
    from mlflow.entities import Param, Run, RunData, RunInfo

    from flows.commands.compare import HEADER, plan_row

    def run(**params: str) -> Run:
        return Run(RunInfo(run_id="r", experiment_id="0", user_id="u", status="FINISHED", start_time=0, end_time=1,
                           lifecycle_stage="active"), RunData(params=[Param(k, v) for k, v in params.items()]))

    def spec_shown(plan_run: Run, train_run: Run) -> str:
        return dict(zip(HEADER, plan_row(plan_run, train_run, "5e1e111ad8e76c0f"), strict=True))["spec"]

    newest_plan_run = run(**{"spec.name": "serve_spec"})
    assert spec_shown(newest_plan_run, run(**{"spec.name": "cpu_demo", "batch_size": "32"})) == "cpu_demo"
    assert spec_shown(newest_plan_run, run(batch_size="32")) == "serve_spec"


def test_a_plan_id_or_spec_hash_not_of_their_form_is_named_not_matched_against_nothing(tmp_path):
    """A prefix or a typo printed "no ... runs matching", exit 0."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code, printed = cli("compare", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--state-dir",
                            str(tmp_path / "state"), "--plan-id", "e65a", "--spec-hash", "xyz", "--last", "0")
    assert code == 2 and printed == ""
    assert err.getvalue().splitlines() == [
        "shardflow: Cannot compare:",
        "  - --last: must be at least 1, got 0",
        "  - --plan-id 'e65a': is not a plan_id (16 hex digits, as `shardflow show` and `shardflow compare` "
        "print them)",
        "  - --spec-hash 'xyz': is not a spec hash (16 hex digits, as `shardflow spec validate` says)"]
    assert not (tmp_path / "mlflow.db").exists()
