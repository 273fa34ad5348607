"""What shardflow records in MLflow: one ``RunRecord`` per run, built from a plan or a training.

A record is complete and plain JSON, so it can wait in the outbox while MLflow is away and be
delivered later exactly as it would have been logged at once. ``EndRecord`` finishes a parent run
(pipeline, replan) that was recorded as RUNNING when it began.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rec.plan import Plan
    from tasks.ingest import Inputs
    from tasks.train import Trained, TrainSettings

# Every run carries STEP and PLAN_ID; RECORD makes delivery idempotent.
STEP = "shardflow.step"  # plan | train | pipeline | replan
PLAN_ID = "shardflow.plan_id"
RECORD = "shardflow.record"
SPEC_HASH = "shardflow.spec_hash"
SPEC_PATH = "shardflow.spec_path"
TOPOLOGY_HASH = "shardflow.topology_hash"
TOPOLOGY_PATH = "shardflow.topology_path"
REPLAN = "shardflow.replan"  # replan runs: unchanged | replanned
PREVIOUS_PLAN_ID = "shardflow.previous_plan_id"  # plan runs replanned from a previous plan
ATTEMPTS = "shardflow.attempts"  # train runs: Prefect attempts the training took
ERROR = "shardflow.error"  # FAILED runs: the cause, in one line
PREFECT_FLOW_RUN = "shardflow.prefect_flow_run"  # the Prefect flow run that recorded the run
PARENT = "mlflow.parentRunId"  # what makes MLflow show a run nested under another

PLAN_ARTIFACTS = ("plan.json", "shards.parquet", "rank_load.png", "movement.parquet")  # the last: replans
TRAIN_ARTIFACTS = ("train_metrics.json", "iterations.parquet")
LATENCY_SERIES = "iteration_latency_ms"
LOSS_SERIES = "loss"
GIB = 1024**3
MAX_ERROR = 500  # characters of the error tag


@dataclass(frozen=True)
class RunRecord:
    """One MLflow run, complete: tags, params, metrics, per-step series and artifact file names."""

    key: str
    step: str
    name: str
    tags: dict[str, str]
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[list[float]]] = field(default_factory=dict)  # name -> [[step, value]]
    artifacts: tuple[str, ...] = ()  # files stored next to the record until delivered
    parent_key: str | None = None
    status: str = "FINISHED"  # RUNNING: a parent run that an EndRecord finishes later
    start_ms: int = 0
    end_ms: int | None = None
    # A plan run is skipped when MLflow already has a finished run of the same plan_id.
    unique_plan: bool = False


@dataclass(frozen=True)
class EndRecord:
    """Finishes the run of record ``key`` with ``status``, adding ``tags``."""

    key: str
    status: str
    end_ms: int
    tags: dict[str, str] = field(default_factory=dict)


def new_key() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return int(time.time() * 1000)


def dumps_record(record: RunRecord | EndRecord) -> str:
    op = "run" if isinstance(record, RunRecord) else "end"
    return json.dumps({"op": op, **asdict(record)}, indent=1, sort_keys=True)


def loads_record(text: str) -> RunRecord | EndRecord:
    d = json.loads(text)
    op = d.pop("op")
    if op == "end":
        return EndRecord(**d)
    d["artifacts"] = tuple(d["artifacts"])
    return RunRecord(**d)


def source_tags(inputs: Inputs) -> dict[str, str]:
    """Which spec file on which topology: what replan_flow looks runs up by."""
    return {SPEC_HASH: inputs.spec.spec_hash, SPEC_PATH: inputs.spec_path,
            TOPOLOGY_HASH: inputs.topology.topology_hash, TOPOLOGY_PATH: inputs.topology_path}


def plan_record(plan: Plan, inputs: Inputs, parent_key: str | None = None,
                planning_s: float | None = None, tags: dict[str, str] | None = None) -> RunRecord:
    m = plan.metrics
    planner = plan.planner
    measured = {} if planning_s is None else {"planning_s": round(planning_s, 4)}
    moved = m.movement or {}
    if moved:
        measured.update(moved_bytes=float(moved["moved_bytes"]),
                        moved_fraction=moved["moved_bytes"] / moved["total_bytes"] if moved["total_bytes"] else 0.0)
    previous = {PREVIOUS_PLAN_ID: plan.previous_plan_id} if plan.previous_plan_id else {}
    return RunRecord(
        key=new_key(), step="plan", name=f"plan-{plan.plan_id}", parent_key=parent_key,
        tags={STEP: "plan", PLAN_ID: plan.plan_id, **source_tags(inputs), **previous, **(tags or {})},
        params={"tables": str(len(plan.tables)), "world_size": str(plan.topology["world_size"]),
                "backend": planner.get("backend", "local"), "groups": str(planner.get("groups", 1)),
                "compute_device": str(plan.topology["compute_device"]),
                "optimizer": str(planner["cost"]["optimizer"]), "bound_method": m.bound_method},
        metrics={**measured, "critical_path": m.critical_path,
                 "lower_bound": m.lower_bound, "gap": m.gap, "optimal": float(m.optimal),
                 "max_hbm_gib": max(m.rank_hbm) / GIB, "max_ddr_gib": max(m.rank_ddr) / GIB},
        artifacts=PLAN_ARTIFACTS, start_ms=now_ms(), end_ms=now_ms(), unique_plan=True,
    )


def train_record(trained: Trained, parent_key: str | None = None,
                 tags: dict[str, str] | None = None) -> RunRecord:
    """The train run; its per-step latency and loss series come from iterations.parquet."""
    import pyarrow.parquet as pq

    m = trained.metrics
    lat = m["iteration_latency_ms"]
    rows = pq.read_table(Path(trained.out_dir) / "iterations.parquet").to_pydict()
    series = {name: [[int(i), float(v)] for i, v in zip(rows["iteration"], rows[column], strict=True)]
              for name, column in ((LATENCY_SERIES, "latency_ms"), (LOSS_SERIES, "loss")) if column in rows}
    loss = {f"loss_{k}": v for k, v in (m.get("loss") or {}).items()}
    return RunRecord(
        key=new_key(), step="train", name=f"train-{trained.plan_id}", parent_key=parent_key,
        tags={STEP: "train", PLAN_ID: trained.plan_id, ATTEMPTS: str(trained.attempts), **(tags or {})},
        params={**_train_params(trained.settings, trained.nproc_per_node),
                "world_size": str(m["world_size"]), "batch_size": str(m["batch_size"]),
                "model": m["model"], "resumed_from": str(m["resumed_from"])},
        metrics={"iteration_latency_ms_p50": lat["p50"], "iteration_latency_ms_p90": lat["p90"],
                 "iteration_latency_ms_p99": lat["p99"], "iteration_latency_ms_mean": lat["mean"],
                 "samples_per_s": m["samples_per_s"], **loss},
        series=series, artifacts=TRAIN_ARTIFACTS, start_ms=trained.started_ms, end_ms=now_ms(),
    )


def _train_params(settings: TrainSettings, nproc_per_node: int | None) -> dict[str, str]:
    job = settings.job
    return {"nnodes": str(settings.nnodes), "nproc_per_node": str(nproc_per_node or "plan"),
            "iterations": str(job.iterations), "warmup": str(job.warmup), "pipeline": job.pipeline.value}


def failed_train_record(plan_id: str, settings: TrainSettings, error: str, attempts: int,
                        started_ms: int, logs: tuple[str, ...], parent_key: str | None = None,
                        tags: dict[str, str] | None = None) -> RunRecord:
    """A FAILED train run: the cause in the ERROR tag, the logs (names under ``logs/``) as artifacts."""
    return RunRecord(
        key=new_key(), step="train", name=f"train-{plan_id}", parent_key=parent_key,
        tags={STEP: "train", PLAN_ID: plan_id, ATTEMPTS: str(attempts), ERROR: error_tag(error),
              **(tags or {})},
        params=_train_params(settings, settings.nproc_per_node), artifacts=logs, status="FAILED",
        start_ms=started_ms, end_ms=now_ms(),
    )


def error_tag(error: str | BaseException) -> str:
    """The cause of a failure in one line, for the ERROR tag."""
    if isinstance(error, BaseException):
        cause = getattr(error, "cause", None)
        if cause is None:
            from rec.train.rank_log import one_line

            cause = one_line(error)
        error = cause
    line = " ".join(str(error).split())
    return line if len(line) <= MAX_ERROR else line[: MAX_ERROR - 3] + "..."


def parent_record(step: str, name: str, plan_id: str, inputs: Inputs,
                  params: dict[str, str], extra_tags: dict[str, str] | None = None) -> RunRecord:
    """A pipeline or replan run, RUNNING until its EndRecord; plan and train runs nest under it."""
    return RunRecord(
        key=new_key(), step=step, name=name, status="RUNNING", start_ms=now_ms(), params=params,
        tags={STEP: step, PLAN_ID: plan_id, **source_tags(inputs), **(extra_tags or {})},
    )


def unchanged_record(inputs: Inputs, plan_id: str) -> RunRecord:
    """replan_flow found the spec unchanged: a small finished run says so."""
    return RunRecord(
        key=new_key(), step="replan", name=f"replan-{Path(inputs.spec_path).stem}",
        tags={STEP: "replan", PLAN_ID: plan_id, REPLAN: "unchanged", **source_tags(inputs)},
        start_ms=now_ms(), end_ms=now_ms(),
    )
