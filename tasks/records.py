"""What shardflow records in MLflow: one ``RunRecord`` per run, built from a plan or a training.

A record is complete and plain JSON, so it can wait in the outbox while MLflow is away and be
delivered later exactly as it would have been logged at once. ``EndRecord`` finishes a parent run
(pipeline, replan) that was recorded as RUNNING when it began.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rec.analysis.iteration_time import prediction
from rec.documents import load_json
from rec.errors import InputError
from rec.plan.chart import CHART_FILE
from rec.plan.io import MOVEMENT_FILE, PLAN_FILE, SHARDS_FILE
from rec.train.metrics import ITERATIONS_FILE, METRICS_FILE, TrainMetrics
from tasks.clock import now_ms as now_ms  # re-exported: the time every record carries

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
# Per-iteration series (step = iteration) under their own prefix: MLflow's UI shows a series' last
# point beside the headline metrics, where an unprefixed name read like another measured latency.
LATENCY_SERIES = "per_iteration/latency_ms"  # every iteration, warm-up included
LOSS_SERIES = "per_iteration/loss"
DATA_WAIT_SERIES = "per_iteration/data_wait_ms"
EVAL_PREFIX = "eval_"  # eval_auc, eval_logloss, eval_ne: at the step of the iteration each evaluation followed
PREDICTED = "predicted_iteration_ms"  # the plan's, on every run (rec.analysis.iteration_time)
MEASURED = "measured_iteration_ms"  # train runs: p50 of the slowest rank; measure runs: the slowest rank's median
RATIO = "measured_over_predicted"
MOVEMENT_COUNTS = ("kept", "moved", "resized", "added", "removed", "reinitialized")  # <kind>_tables
GIB = 1024**3
MAX_ERROR = 500  # characters of the error tag
# MLflow's MAX_PARAM_VAL_LENGTH: above it MLflow cuts a value without a mark (or, with
# MLFLOW_TRUNCATE_LONG_VALUES=false, refuses the whole record), so records cut it first, visibly.
MAX_PARAM = 6000
MODEL_BATCHES = "the model's own batches"  # the data param of a --model TARGET training


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", cut_params(self.params))


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", cut_params(self.params))


def cut_params(params: dict[str, str]) -> dict[str, str]:
    """``params`` with each value longer than MLflow takes (``MAX_PARAM``) cut to its first part,
    ending in ``... (N characters)``: the whole value's length."""
    return {name: value if len(value) <= MAX_PARAM else _cut(value) for name, value in params.items()}


def _cut(value: str) -> str:
    mark = f"... ({len(value)} characters)"
    return value[: MAX_PARAM - len(mark)] + mark


KEY = re.compile(r"[0-9a-f]{32}")  # new_key's form: a record key is part of an outbox entry's name


def new_key() -> str:
    return uuid.uuid4().hex


def dumps_record(record: RunRecord | EndRecord) -> str:
    op = "run" if isinstance(record, RunRecord) else "end"
    return json.dumps({"op": op, **asdict(record)}, indent=1, sort_keys=True)


def loads_record(text: str) -> RunRecord | EndRecord:
    """The record ``dumps_record`` wrote; ValueError for anything else (a damaged or edited file)."""
    try:
        d: Any = load_json(text)
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
    """What a plan was made for and how, from the plan itself: who planned it (``planner``), its
    tables, the spec's hash, the topology's hash and every key (``topology.<key>``, in the topology
    file's units: bytes, bytes/s), the profile, and the cost and search settings (``cost.<knob>``,
    ``search.<knob>``; ``max_regress`` of a replan)."""
    from rec.plan.plan_id import made_by, plan_profile
    from rec.plan.plan_json import planner_to_dict
    from rec.profile import profile_hash
    from rec.topology import topology_to_dict

    profile = plan_profile(plan)
    params = {"planner": made_by(plan), "tables": str(len(plan.tables)), "spec.hash": plan.spec_hash,
              "topology.hash": plan.topology.topology_hash,
              **{f"topology.{key}": str(value) for key, value in topology_to_dict(plan.topology).items()},
              "profile.name": profile.name or ("default" if profile.is_default else "unnamed"),
              "profile.hash": profile_hash(profile)}
    planner = planner_to_dict(plan.planner)
    for group in ("cost", "search"):
        params.update({f"{group}.{key}": str(value) for key, value in planner.get(group, {}).items()})
    if plan.planner.max_regress is not None:
        params["max_regress"] = str(plan.planner.max_regress)
    return params


def plan_metrics(plan: Plan) -> dict[str, float]:
    """The plan's predicted iteration time and its parts, its quality in TorchRec's cost model,
    units in the names, unrounded; a replanned plan's movement too (``moved_*``, ``<kind>_tables``,
    against a plan from scratch). Plan, train, measure and pipeline runs all carry them."""
    m = plan.metrics
    predicted = prediction(plan)
    out = {PREDICTED: predicted.iteration_ms, "plan_level_ms": predicted.plan_level_ms,
           "critical_path_ms": m.critical_path, "lower_bound_ms": m.lower_bound, "gap_pct": 100 * m.gap,
           "optimal": float(m.optimal)}
    if predicted.widest_ms:
        out["widest_ms"] = predicted.widest_ms
    moved = m.movement
    if moved:
        total = moved.total_bytes
        moved_pct = 100 * (moved.moved_bytes / total) if total else 0.0
        out.update(moved_bytes=float(moved.moved_bytes), moved_pct=moved_pct, total_bytes=float(total))
        out.update({f"{kind}_tables": float(getattr(moved, f"{kind}_tables")) for kind in MOVEMENT_COUNTS})
        fresh = moved.fresh_critical_path
        if fresh:
            out.update(fresh_critical_path_ms=fresh, regress_pct=100 * (m.critical_path / fresh - 1))
    return out


def plan_record(plan: Plan, inputs: Inputs, parent_key: str | None = None,
                planning_s: float | None = None, tags: dict[str, str] | None = None) -> RunRecord:
    m = plan.metrics
    planner = plan.planner
    measured = {} if planning_s is None else {"planning_s": planning_s}
    previous = {PREVIOUS_PLAN_ID: plan.previous_plan_id} if plan.previous_plan_id else {}
    return RunRecord(
        key=new_key(), step=RunStep.PLAN, name=f"plan-{plan.plan_id}", parent_key=parent_key,
        tags={STEP: RunStep.PLAN, PLAN_ID: plan.plan_id, **source_tags(inputs), **previous, **(tags or {})},
        params={"world_size": str(plan.topology.world_size),
                "backend": planner.backend or "local", "groups": str(planner.groups or 1),
                "compute_device": plan.topology.compute_device.value,
                "optimizer": planner.cost.optimizer.value, "bound_method": str(m.bound_method),
                **input_params(inputs), **plan_params(plan)},
        metrics=with_legacy_names(RunStep.PLAN, {
            **measured, **plan_metrics(plan),
            "max_hbm_gib": max(m.rank_hbm) / GIB, "max_ddr_gib": max(m.rank_ddr) / GIB}),
        artifacts=PLAN_ARTIFACTS, start_ms=now_ms(), end_ms=now_ms(), unique_plan=True,
    )


def plan_tags(params: dict[str, str]) -> dict[str, str]:
    """The spec and topology hashes of the plan a train or measure run ran (from its ``plan_params``):
    what ``shardflow compare --spec-hash`` finds runs by, plan run or not."""
    return {SPEC_HASH: params["spec.hash"], TOPOLOGY_HASH: params["topology.hash"]}


def ran_plan(plan_path: str) -> Plan | None:
    """The plan a training ran with (None: its path unknown)."""
    from rec.plan import read_plan

    return read_plan(plan_path) if plan_path else None


def ran_plan_labels(plan: Plan | None) -> tuple[dict[str, str], dict[str, str]]:
    """The tags and params of the plan a train run ran (``plan_tags``, ``plan_params``): a
    successful and a FAILED run alike; none without the plan."""
    if plan is None:
        return {}, {}
    params = plan_params(plan)
    return plan_tags(params), params


def train_metrics(metrics: TrainMetrics, plan_batch_size: int | None = None,
                  predicted_ms: float | None = None) -> dict[str, float]:
    """A training's headline (train_metrics.json): the measured iteration time (the slowest rank's,
    over the iterations after the warm-up: p50 and its spread), samples/s, the plan's predicted
    iteration time beside it and, trained at the batch size the plan predicts for, their ratio."""
    lat = metrics.iteration_latency_ms
    predicted = metrics.predicted_critical_path_ms if predicted_ms is None else predicted_ms
    out = {MEASURED: lat.p50, "measured_iteration_p90_ms": lat.p90, "measured_iteration_p99_ms": lat.p99,
           "measured_iteration_mean_ms": lat.mean, "samples_per_s": metrics.samples_per_s}
    if predicted is not None:
        out[PREDICTED] = float(predicted)
        if predicted > 0 and plan_batch_size == metrics.batch_size:
            out[RATIO] = lat.p50 / predicted
    return out


def train_record(trained: Trained, parent_key: str | None = None, tags: dict[str, str] | None = None,
                 inputs: Inputs | None = None) -> RunRecord:
    """The train run; its per-step latency and loss series come from iterations.parquet, its plan
    params and metrics (what the plan was made for, what it predicts) from the plan it trained with."""
    import pyarrow.parquet as pq

    m = trained.metrics
    assert m is not None, "node 0 records the training: it has the metrics"
    plan = ran_plan(trained.plan_path)
    rows = pq.read_table(Path(trained.out_dir) / ITERATIONS_FILE).to_pydict()
    # NaN: no loss kept (the rows of an early shardflow's training that this one resumed)
    series = {name: [[int(i), float(v)] for i, v in zip(rows["iteration"], rows[column], strict=True)
                    if not math.isnan(v)]
              for name, column in ((LATENCY_SERIES, "latency_ms"), (LOSS_SERIES, "loss"),
                                   (DATA_WAIT_SERIES, "data_wait_ms")) if column in rows}
    series.update(eval_series(m))
    if legacy_names() and LATENCY_SERIES in series:
        series.update(_legacy_series(series, rows))
    loss = {f"loss_{k}": v for k, v in asdict(m.loss).items()}
    labels, params = ran_plan_labels(plan)
    predicted = prediction(plan) if plan else None
    return RunRecord(
        key=new_key(), step=RunStep.TRAIN, name=f"train-{trained.plan_id}", parent_key=parent_key,
        tags={STEP: RunStep.TRAIN, PLAN_ID: trained.plan_id, ATTEMPTS: str(trained.attempts),
              **labels, **(tags or {})},
        params={**_train_params(trained.settings, trained.nproc_per_node), **data_params(m),
                "world_size": str(m.world_size), "batch_size": str(m.batch_size),
                "model": m.model, "resumed_from": str(m.resumed_from),
                **({"resumed_from_plan_id": m.resume.from_plan_id} if m.resume else {}),
                **(input_params(inputs) if inputs else {}), **params},
        metrics=with_legacy_names(RunStep.TRAIN, {
            **(plan_metrics(plan) if plan else {}),
            **train_metrics(m, predicted.batch_size if predicted else None,
                            predicted.iteration_ms if predicted else None), **loss,
            **({"data_wait_p50_ms": m.data_wait_ms.p50} if m.data_wait_ms else {}),
            "restarts": float(m.restarts),
            **({"eval_samples": float(m.eval["samples"] or 0)} if m.eval else {})}),
        series=series, artifacts=TRAIN_ARTIFACTS, start_ms=trained.started_ms, end_ms=now_ms(),
    )


def _train_params(settings: TrainSettings, nproc_per_node: int | None) -> dict[str, str]:
    """The settings' params; ``nproc_per_node`` the processes a node started (None: not known)."""
    job = settings.job
    data = MODEL_BATCHES if job.model_target else job.data or "synthetic"
    return {"nnodes": str(settings.nnodes),
            **({"nproc_per_node": str(nproc_per_node)} if nproc_per_node else {}),
            "iterations": str(job.iterations), "warmup": str(job.warmup), "pipeline": job.pipeline.value,
            "seed": str(job.seed), "dense_lr": str(job.dense_lr), "embedding_lr": str(job.embedding_lr),
            "data": data, "ids": job.ids.value, "shuffle": str(job.shuffle),
            "eval_data": job.eval_data or "-", "eval_every": str(job.eval_every),
            "eval_batches": str(job.eval_batches)}


def data_params(metrics: TrainMetrics) -> dict[str, str]:
    """What the training read, as train_metrics.json's ``data`` says (rows, files, epochs read)."""
    data = metrics.data
    if data is None:
        return {}
    return {"data.rows": str(data.rows), "data.files": str(data.files), "data.epochs": f"{data.epochs:g}"}


def eval_series(metrics: TrainMetrics) -> dict[str, list[list[float]]]:
    """Each evaluation metric over the run (``eval_auc`` ...), stepped as the per-iteration series
    are: an evaluation's ``iteration`` counts the iterations before it, the row it followed is one less."""
    series: dict[str, list[list[float]]] = {}
    for e in metrics.evaluations:
        step = int(e["iteration"] or 0) - 1
        for name, value in e.items():
            if name not in ("iteration", "samples") and value is not None:
                series.setdefault(f"{EVAL_PREFIX}{name}", []).append([step, float(value)])
    return series


def failed_train_record(plan_id: str, settings: TrainSettings, error: str, attempts: int,
                        started_ms: int, logs: tuple[str, ...], parent_key: str | None = None,
                        tags: dict[str, str] | None = None, plan_path: str = "") -> RunRecord:
    """A FAILED train run: the cause in the ERROR tag, the logs (names under ``logs/``) as artifacts,
    and, given the plan it trained with (``plan_path``), that plan's tags and params as a successful
    run has them, and the processes started per node where the settings left them to the plan."""
    try:
        plan = ran_plan(plan_path)
    except (InputError, OSError):  # the failure is recorded all the same, without the plan's labels
        plan = None
    labels, params = ran_plan_labels(plan)
    nproc = settings.processes(plan.topology) if plan else settings.nproc_per_node
    return RunRecord(
        key=new_key(), step=RunStep.TRAIN, name=f"train-{plan_id}", parent_key=parent_key,
        tags={STEP: RunStep.TRAIN, PLAN_ID: plan_id, ATTEMPTS: str(attempts), ERROR: error_tag(error),
              **labels, **(tags or {})},
        params={**_train_params(settings, nproc), **params}, artifacts=logs, status=RunStatus.FAILED,
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


# Metric names before 0.2.0 (docs/mlflow.md, "Names before 0.2.0"): logged beside today's with
# SHARDFLOW_LEGACY_METRIC_NAMES=1, for dashboards and queries that still read them.
LEGACY_NAMES_ENV = "SHARDFLOW_LEGACY_METRIC_NAMES"
# old name: (today's name, scale, offset), old = today * scale + offset
LEGACY_PLAN = {"critical_path": ("critical_path_ms", 1.0, 0.0), "lower_bound": ("lower_bound_ms", 1.0, 0.0),
               "gap": ("gap_pct", 0.01, 0.0), "moved_fraction": ("moved_pct", 0.01, 0.0)}
LEGACY_TRAIN = {"predicted_critical_path_ms": (PREDICTED, 1.0, 0.0),
                "iteration_latency_ms_p50": (MEASURED, 1.0, 0.0),
                **{f"iteration_latency_ms_{q}": (f"measured_iteration_{q}_ms", 1.0, 0.0)
                   for q in ("p90", "p99", "mean")}}
LEGACY_MEASURE = {"critical_path_predicted_ms": (PREDICTED, 1.0, 0.0),
                  "critical_path_measured_ms": (MEASURED, 1.0, 0.0),
                  "measured_p90_ms": ("measured_iteration_p90_ms", 1.0, 0.0), "error": (RATIO, 1.0, -1.0)}
LEGACY_LATENCY_SERIES, LEGACY_MEASURED_SERIES, LEGACY_LOSS_SERIES = (
    "iteration_latency_ms", "iteration_latency_ms_measured", "loss")


def legacy_names() -> bool:
    """Whether runs also carry the metric names from before 0.2.0 (``SHARDFLOW_LEGACY_METRIC_NAMES=1``)."""
    return os.environ.get(LEGACY_NAMES_ENV, "").strip().lower() in ("1", "true", "yes")


def with_legacy_names(step: RunStep, metrics: dict[str, float]) -> dict[str, float]:
    """``metrics``, and with the compatibility switch on, the old name of each one that had another."""
    if not legacy_names():
        return metrics
    table = {**LEGACY_PLAN, **(LEGACY_MEASURE if step is RunStep.MEASURE else LEGACY_TRAIN)}
    old = {name: metrics[new] * scale + offset for name, (new, scale, offset) in table.items() if new in metrics}
    return {**metrics, **old}


def _legacy_series(series: dict[str, list[list[float]]], rows: dict[str, Any]) -> dict[str, list[list[float]]]:
    """The series under their names before 0.2.0, and the latency of the iterations the statistics
    are over (neither warm-up nor the first after a resume) as a series of its own."""
    out = {LEGACY_LATENCY_SERIES: series[LATENCY_SERIES]}
    if LOSS_SERIES in series:
        out[LEGACY_LOSS_SERIES] = series[LOSS_SERIES]
    if "warmup" in rows:
        left_out = [w or r for w, r in zip(rows["warmup"], rows.get("resumed", [False] * len(rows["warmup"])),
                                           strict=True)]
        out[LEGACY_MEASURED_SERIES] = [point for point, skip in zip(series[LATENCY_SERIES], left_out, strict=True)
                                       if not skip]
    return out


def parent_record(step: RunStep, name: str, plan_id: str, inputs: Inputs,
                  params: dict[str, str], extra_tags: dict[str, str] | None = None) -> RunRecord:
    """A pipeline or replan run, RUNNING until its EndRecord; plan and train runs nest under it.
    Its EndRecord adds the plan's params and metrics and the training's headline metrics."""
    return RunRecord(
        key=new_key(), step=step, name=name, status=RunStatus.RUNNING, start_ms=now_ms(),
        params={**params, **input_params(inputs)},
        tags={STEP: step, PLAN_ID: plan_id, **source_tags(inputs), **(extra_tags or {})},
    )

