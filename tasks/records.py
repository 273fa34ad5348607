"""What shardflow records in MLflow: one ``RunRecord`` per run, built from a plan or a training.

A record is complete and plain JSON, so it can wait in the outbox while MLflow is away and be
delivered later exactly as it would have been logged at once. ``EndRecord`` finishes a parent run
(pipeline, replan) that was recorded as RUNNING when it began.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from rec.plan.chart import CHART_FILE
from rec.plan.io import MOVEMENT_FILE, PLAN_FILE, SHARDS_FILE
from rec.profile.predict import predicted_critical_path
from rec.train.metrics import ITERATIONS_FILE, METRICS_FILE

if TYPE_CHECKING:
    from rec.plan import Plan
    from tasks.ingest import Inputs
    from tasks.train import Trained, TrainSettings



class RunStep(StrEnum):
    """What a run records: its ``shardflow.step`` tag."""

    PLAN = "plan"
    TRAIN = "train"
    PIPELINE = "pipeline"  # a parent run: plan and train nested
    REPLAN = "replan"  # a parent run: the replanned plan nested
    MEASURE = "measure"


class RunStatus(StrEnum):
    """MLflow's names of the run states shardflow records."""

    RUNNING = "RUNNING"  # a parent run until its EndRecord
    FINISHED = "FINISHED"
    FAILED = "FAILED"


# Every run carries STEP and PLAN_ID; RECORD makes delivery idempotent.
STEP = "shardflow.step"  # a RunStep
PLAN_ID = "shardflow.plan_id"
RECORD = "shardflow.record"
SPEC_HASH = "shardflow.spec_hash"
SPEC_PATH = "shardflow.spec_path"
TOPOLOGY_HASH = "shardflow.topology_hash"
TOPOLOGY_PATH = "shardflow.topology_path"
REPLAN = "shardflow.replan"  # replan runs: replanned (unchanged: only from versions that recorded checks)
PREVIOUS_PLAN_ID = "shardflow.previous_plan_id"  # plan runs replanned from a previous plan
ATTEMPTS = "shardflow.attempts"  # train runs: Prefect attempts the training took
ERROR = "shardflow.error"  # FAILED runs: the cause, in one line
PREFECT_FLOW_RUN = "shardflow.prefect_flow_run"  # the Prefect flow run that recorded the run
PARENT = "mlflow.parentRunId"  # what makes MLflow show a run nested under another
PARENT_RECORD = "shardflow.parent_record"  # nested runs: their parent's record key (links them late)
PARTIAL_RECORD = "shardflow.partial_record"  # while a record is delivered; RECORD replaces it when complete

PLAN_ARTIFACTS = (PLAN_FILE, SHARDS_FILE, CHART_FILE, MOVEMENT_FILE)  # the last: replans
TRAIN_ARTIFACTS = (METRICS_FILE, ITERATIONS_FILE)
LATENCY_SERIES = "iteration_latency_ms"  # every iteration, warm-up included
MEASURED_SERIES = "iteration_latency_ms_measured"  # the iterations the latency statistics are over
LOSS_SERIES = "loss"
MOVEMENT_COUNTS = ("kept", "moved", "resized", "added", "removed", "reinitialized")  # <kind>_tables
GIB = 1024**3
MAX_ERROR = 500  # characters of the error tag


@dataclass(frozen=True)
class RunRecord:
    """One MLflow run, complete: tags, params, metrics, per-step series and artifact file names."""

    key: str
    step: RunStep
    name: str
    tags: dict[str, str]
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[list[float]]] = field(default_factory=dict)  # name -> [[step, value]]
    artifacts: tuple[str, ...] = ()  # files stored next to the record until delivered
    parent_key: str | None = None
    status: RunStatus = RunStatus.FINISHED  # RUNNING: a parent run that an EndRecord finishes later
    start_ms: int = 0
    end_ms: int | None = None
    # A plan run is skipped when MLflow already has a finished run of the same plan_id.
    unique_plan: bool = False


@dataclass(frozen=True)
class EndRecord:
    """Finishes the run of record ``key`` with ``status``, adding ``tags``, ``params`` (names the
    run does not have yet) and ``metrics`` (a parent run's headline metrics)."""

    key: str
    status: RunStatus
    end_ms: int
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


KEY = re.compile(r"[0-9a-f]{32}")  # new_key's form: a record key is part of an outbox entry's name


def new_key() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return int(time.time() * 1000)


def dumps_record(record: RunRecord | EndRecord) -> str:
    op = "run" if isinstance(record, RunRecord) else "end"
    return json.dumps({"op": op, **asdict(record)}, indent=1, sort_keys=True)


def loads_record(text: str) -> RunRecord | EndRecord:
    """The record ``dumps_record`` wrote; ValueError for anything else (a damaged or edited file)."""
    try:
        d = json.loads(text)
        op = d.pop("op")
        d["status"] = RunStatus(d["status"])
        if op == "end":
            record: RunRecord | EndRecord = EndRecord(**d)
        else:
            d["artifacts"] = tuple(d["artifacts"])
            d["step"] = RunStep(d["step"])
            record = RunRecord(**d)
    except (TypeError, KeyError, AttributeError, ValueError) as e:  # ValueError: a step or status unknown
        raise ValueError(f"not a shardflow record: {e}") from None
    keys = [record.key] + ([record.parent_key] if isinstance(record, RunRecord) and record.parent_key else [])
    if not all(isinstance(k, str) and KEY.fullmatch(k) for k in keys):
        raise ValueError(f"not a shardflow record: a key is not {KEY.pattern}")
    if isinstance(record, RunRecord) and not all(_artifact_name(a) for a in record.artifacts):
        raise ValueError("not a shardflow record: an artifact name is not a relative path inside the record")
    return record


def _artifact_name(name: object) -> bool:
    """A path inside the record's directory (``logs/rank-0.log``), never out of it."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def source_tags(inputs: Inputs) -> dict[str, str]:
    """Which spec file on which topology: what replan_flow looks runs up by."""
    return {SPEC_HASH: inputs.spec.spec_hash, SPEC_PATH: inputs.spec_path,
            TOPOLOGY_HASH: inputs.topology.topology_hash, TOPOLOGY_PATH: inputs.topology_path}


def input_params(inputs: Inputs) -> dict[str, str]:
    """The spec's and the topology's names (their files' stems): what a person tells runs apart by."""
    return {"spec.name": Path(inputs.spec_path).stem, "topology.name": Path(inputs.topology_path).stem}


def plan_params(plan: Plan) -> dict[str, str]:
    """What a plan was made for and how, from the plan itself: the spec's hash, the topology's hash
    and every key (``topology.<key>``, in the topology file's units: bytes, bytes/s), the profile,
    and the cost and search settings (``cost.<knob>``, ``search.<knob>``; ``max_regress`` of a replan)."""
    from rec.plan.identity import plan_profile
    from rec.profile import profile_hash
    from rec.topology import topology_from_dict

    profile = plan_profile(plan)
    params = {"spec.hash": plan.spec_hash,
              "topology.hash": topology_from_dict(plan.topology, source="in the plan").topology_hash,
              **{f"topology.{key}": str(value) for key, value in plan.topology.items()},
              "profile.name": profile.name or ("default" if profile.is_default else "unnamed"),
              "profile.hash": profile_hash(profile)}
    for group in ("cost", "search"):
        params.update({f"{group}.{key}": str(value) for key, value in plan.planner.get(group, {}).items()})
    if "max_regress" in plan.planner:
        params["max_regress"] = str(plan.planner["max_regress"])
    return params


def plan_metrics(plan: Plan) -> dict[str, float]:
    """The plan's quality in TorchRec's cost model, units in the names, unrounded; a replanned
    plan's movement too (``moved_*``, ``<kind>_tables``, against a plan from scratch)."""
    m = plan.metrics
    out = {"critical_path_ms": m.critical_path, "lower_bound_ms": m.lower_bound, "gap_pct": 100 * m.gap,
           "optimal": float(m.optimal), "predicted_critical_path_ms": predicted_critical_path(plan)}
    moved = m.movement
    if moved:
        total = moved["total_bytes"]
        fraction = moved["moved_bytes"] / total if total else 0.0
        out.update(moved_bytes=float(moved["moved_bytes"]), moved_fraction=fraction, moved_pct=100 * fraction,
                   total_bytes=float(total))
        out.update({f"{kind}_tables": float(moved[f"{kind}_tables"]) for kind in MOVEMENT_COUNTS})
        fresh = moved.get("fresh_critical_path")
        if fresh:
            out.update(fresh_critical_path_ms=fresh, regress_pct=100 * (m.critical_path / fresh - 1))
    return out


def plan_record(plan: Plan, inputs: Inputs, parent_key: str | None = None,
                planning_s: float | None = None, tags: dict[str, str] | None = None) -> RunRecord:
    m = plan.metrics
    planner = plan.planner
    measured = {} if planning_s is None else {"planning_s": round(planning_s, 4)}
    previous = {PREVIOUS_PLAN_ID: plan.previous_plan_id} if plan.previous_plan_id else {}
    return RunRecord(
        key=new_key(), step=RunStep.PLAN, name=f"plan-{plan.plan_id}", parent_key=parent_key,
        tags={STEP: RunStep.PLAN, PLAN_ID: plan.plan_id, **source_tags(inputs), **previous, **(tags or {})},
        params={"tables": str(len(plan.tables)), "world_size": str(plan.topology["world_size"]),
                "backend": planner.get("backend", "local"), "groups": str(planner.get("groups", 1)),
                "compute_device": str(plan.topology["compute_device"]),
                "optimizer": str(planner["cost"]["optimizer"]), "bound_method": m.bound_method,
                **input_params(inputs), **plan_params(plan)},
        # critical_path, lower_bound and gap: the names before units were in them, kept.
        metrics={**measured, **plan_metrics(plan), "critical_path": m.critical_path,
                 "lower_bound": m.lower_bound, "gap": m.gap,
                 "max_hbm_gib": max(m.rank_hbm) / GIB, "max_ddr_gib": max(m.rank_ddr) / GIB},
        artifacts=PLAN_ARTIFACTS, start_ms=now_ms(), end_ms=now_ms(), unique_plan=True,
    )


def train_metrics(metrics: dict, predicted_ms: float | None = None) -> dict[str, float]:
    """A training's headline (train_metrics.json): latency percentiles of the iterations after
    the warm-up, samples/s, and the plan's predicted critical path beside them."""
    lat = metrics["iteration_latency_ms"]
    predicted = metrics.get("predicted_critical_path_ms", predicted_ms)
    return {"iteration_latency_ms_p50": lat["p50"], "iteration_latency_ms_p90": lat["p90"],
            "iteration_latency_ms_p99": lat["p99"], "iteration_latency_ms_mean": lat["mean"],
            "samples_per_s": metrics["samples_per_s"],
            **({"predicted_critical_path_ms": float(predicted)} if predicted is not None else {})}


def train_record(trained: Trained, parent_key: str | None = None, tags: dict[str, str] | None = None,
                 inputs: Inputs | None = None) -> RunRecord:
    """The train run; its per-step latency and loss series come from iterations.parquet, its plan
    params (what the plan was made for) from the plan it trained with."""
    import pyarrow.parquet as pq

    from rec.plan import read_plan

    m = trained.metrics
    plan = read_plan(trained.plan_path) if trained.plan_path else None
    rows = pq.read_table(Path(trained.out_dir) / ITERATIONS_FILE).to_pydict()
    series = {name: [[int(i), float(v)] for i, v in zip(rows["iteration"], rows[column], strict=True)]
              for name, column in ((LATENCY_SERIES, "latency_ms"), (LOSS_SERIES, "loss")) if column in rows}
    if "warmup" in rows:
        left_out = [w or r for w, r in zip(rows["warmup"], rows.get("resumed", [False] * len(rows["warmup"])),
                                           strict=True)]
        series[MEASURED_SERIES] = [point for point, out in zip(series[LATENCY_SERIES], left_out, strict=True)
                                   if not out]
    loss = {f"loss_{k}": v for k, v in (m.get("loss") or {}).items()}
    return RunRecord(
        key=new_key(), step=RunStep.TRAIN, name=f"train-{trained.plan_id}", parent_key=parent_key,
        tags={STEP: RunStep.TRAIN, PLAN_ID: trained.plan_id, ATTEMPTS: str(trained.attempts), **(tags or {})},
        params={**_train_params(trained.settings, trained.nproc_per_node),
                "world_size": str(m["world_size"]), "batch_size": str(m["batch_size"]),
                "model": m["model"], "resumed_from": str(m["resumed_from"]),
                **(input_params(inputs) if inputs else {}), **(plan_params(plan) if plan else {})},
        metrics={**train_metrics(m, predicted_critical_path(plan) if plan else None), **loss},
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
        key=new_key(), step=RunStep.TRAIN, name=f"train-{plan_id}", parent_key=parent_key,
        tags={STEP: RunStep.TRAIN, PLAN_ID: plan_id, ATTEMPTS: str(attempts), ERROR: error_tag(error),
              **(tags or {})},
        params=_train_params(settings, settings.nproc_per_node), artifacts=logs, status=RunStatus.FAILED,
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


def parent_record(step: RunStep, name: str, plan_id: str, inputs: Inputs,
                  params: dict[str, str], extra_tags: dict[str, str] | None = None) -> RunRecord:
    """A pipeline or replan run, RUNNING until its EndRecord; plan and train runs nest under it.
    Its EndRecord adds the plan's params and metrics and the training's headline metrics."""
    return RunRecord(
        key=new_key(), step=step, name=name, status=RunStatus.RUNNING, start_ms=now_ms(),
        params={**params, **input_params(inputs)},
        tags={STEP: step, PLAN_ID: plan_id, **source_tags(inputs), **(extra_tags or {})},
    )

