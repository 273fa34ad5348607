"""The MLflow run of a ``shardflow measure``: a ``RunRecord`` (``tasks.records``), linked to its plan
by ``shardflow.plan_id`` like a train run, with measure.json as its artifact (docs/mlflow.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rec.train.measure_report import MEASURE_FILE
from tasks.records import PLAN_ID, STEP, RunRecord, RunStep, new_key, now_ms

if TYPE_CHECKING:
    from tasks.measure import Measured
    from tasks.recorder import Logged
    from tasks.tracking import Tracking

MEASURE_STEP = RunStep.MEASURE
PROFILE_HASH = "shardflow.profile_hash"  # the profile the plan was made under (its predictions)
MEASURE_ARTIFACTS = (MEASURE_FILE,)


def measure_record(measured: Measured, tags: dict[str, str] | None = None) -> RunRecord:
    """The measure run: predicted and measured critical path, their error, per-rank times."""
    report = measured.report
    assert report is not None, "node 0 records the run"
    s = measured.settings
    per_rank = {f"{name}_rank{r}": v for name, values in (("predicted_ms", report.predicted_ms),
                                                          ("measured_ms", report.measured_ms))
                for r, v in enumerate(values)} if report.world_size <= 64 else {}
    error = {} if report.error is None else {"error": report.error}
    return RunRecord(
        key=new_key(), step=MEASURE_STEP, name=f"measure-{measured.plan_id}",
        tags={STEP: MEASURE_STEP, PLAN_ID: measured.plan_id, PROFILE_HASH: report.profile["hash"], **(tags or {})},
        params={"world_size": str(report.world_size), "compute_device": report.compute_device,
                "batch_size": str(report.batch_size), "iterations": str(report.iterations),
                "warmup": str(report.warmup), "nnodes": str(s.ranks.nnodes),
                "nproc_per_node": str(measured.nproc_per_node), "profile": report.profile["name"] or
                ("default" if report.profile["default"] else "unnamed"),
                "device_name": str(report.machine.get("device_name"))},
        metrics={"critical_path_predicted_ms": report.critical_path_predicted,
                 "critical_path_measured_ms": report.critical_path_measured, **error,
                 "measured_p90_ms": max(report.measured_p90_ms), **per_rank},
        artifacts=MEASURE_ARTIFACTS, start_ms=measured.started_ms, end_ms=now_ms(),
    )


def record_measure(tracking: Tracking, measured: Measured) -> Logged:
    """Record the measure run (outbox first, then delivered, as every shardflow run)."""
    from tasks.recorder import record

    rec = measure_record(measured)
    return record(tracking, rec, {name: Path(measured.out_dir) / name for name in rec.artifacts})
