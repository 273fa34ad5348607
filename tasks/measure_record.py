"""The MLflow run of a ``shardflow measure``: a ``RunRecord`` (``tasks.records``), linked to its plan
by ``shardflow.plan_id`` like a train run and carrying the plan's params and metrics as a train run
does (``shardflow compare`` lists it whoever made the plan), with measure.json as its artifact
(docs/mlflow.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rec.train.measure_report import MEASURE_FILE
from tasks.records import (
    MEASURED,
    PLAN_ID,
    PREDICTED,
    RATIO,
    STEP,
    RunRecord,
    RunStep,
    new_key,
    now_ms,
    plan_metrics,
    plan_params,
    plan_tags,
    with_legacy_names,
)

if TYPE_CHECKING:
    from tasks.measure import Measured
    from tasks.recorder import Logged
    from tasks.tracking import Tracking

MEASURE_STEP = RunStep.MEASURE
PROFILE_HASH = "shardflow.profile_hash"  # the profile the plan was made under (its predictions)
MEASURE_ARTIFACTS = (MEASURE_FILE,)
MAX_RANK_METRICS = 64  # ranks with metrics of their own; beyond, the critical path alone


def measure_record(measured: Measured, tags: dict[str, str] | None = None) -> RunRecord:
    """The measure run: the plan's predicted iteration time beside the measured one (the slowest
    rank's median) and their ratio, the plan's params and metrics, per-rank times."""
    from rec.plan import read_plan

    report = measured.report
    assert report is not None, "node 0 records the run"
    s = measured.settings
    plan = read_plan(measured.plan_path) if measured.plan_path else None
    params = plan_params(plan) if plan else {}
    per_rank = {f"{name}_rank{r}": v for name, values in (("predicted_ms", report.predicted_ms),
                                                          ("measured_ms", report.measured_ms))
                for r, v in enumerate(values)} if report.world_size <= MAX_RANK_METRICS else {}
    metrics = {**(plan_metrics(plan) if plan else {PREDICTED: report.critical_path_predicted}),
               MEASURED: report.critical_path_measured, "measured_iteration_p90_ms": max(report.measured_p90_ms)}
    if metrics[PREDICTED] > 0:
        metrics[RATIO] = metrics[MEASURED] / metrics[PREDICTED]
    return RunRecord(
        key=new_key(), step=MEASURE_STEP, name=f"measure-{measured.plan_id}",
        tags={STEP: MEASURE_STEP, PLAN_ID: measured.plan_id, PROFILE_HASH: report.profile["hash"],
              **(plan_tags(params) if plan else {}), **(tags or {})},
        params={"world_size": str(report.world_size), "compute_device": report.compute_device,
                "batch_size": str(report.batch_size), "iterations": str(report.iterations),
                "warmup": str(report.warmup), "nnodes": str(s.ranks.nnodes),
                "nproc_per_node": str(measured.nproc_per_node), "profile": report.profile["name"] or
                ("default" if report.profile["default"] else "unnamed"),
                "device_name": str(report.machine.get("device_name")), **params},
        metrics=with_legacy_names(MEASURE_STEP, {**metrics, **per_rank}),
        artifacts=MEASURE_ARTIFACTS, start_ms=measured.started_ms, end_ms=now_ms(),
    )


def record_measure(tracking: Tracking, measured: Measured) -> Logged:
    """Record the measure run (outbox first, then delivered, as every shardflow run)."""
    from tasks.recorder import record

    rec = measure_record(measured)
    return record(tracking, rec, {name: Path(measured.out_dir) / name for name in rec.artifacts})
