"""Iteration latency and loss statistics, and the files rank 0 writes: train_metrics.json,
iterations.parquet (one row per iteration: latency of the slowest rank, mean loss over the ranks).

A training that resumes from its own checkpoint keeps the rows of the iterations before it and the
evaluations after them (``earlier_iterations``; an evaluation is kept in the ``eval_*`` columns of
the row of the iteration it came after), so iterations.parquet holds every iteration of the training
and train_metrics.json every evaluation; the first
iteration after a resume (cold caches, a fresh pipeline) is marked ``resumed`` and, like the
warm-up, left out of the latency statistics. Both files are replaced whole (written beside, then
renamed): a reader, or a failed write, never sees half a file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rec.disk_full import write_whole

if TYPE_CHECKING:
    from rec.train.ownership import Run
    from rec.validation import Problems

METRICS_FILE = "train_metrics.json"
ITERATIONS_FILE = "iterations.parquet"
ITERATION_COLUMNS = ("iteration", "latency_ms", "loss", "warmup", "resumed", "data_wait_ms")


@dataclass(frozen=True)
class LatencyStats:
    p50: float
    p90: float
    p99: float
    mean: float


@dataclass(frozen=True)
class Iterations:
    """Rows of iterations.parquet, one per iteration, in order."""

    iteration: np.ndarray  # int64
    latency_ms: np.ndarray  # float64: the slowest rank's
    loss: np.ndarray  # float64: the mean over the ranks
    warmup: np.ndarray  # bool: iteration < --warmup
    resumed: np.ndarray  # bool: the first iteration after a resume
    data_wait_ms: np.ndarray  # float64: the longest a rank waited for its batch

    @classmethod
    def of_run(cls, start: int, latency_ms: np.ndarray, loss: np.ndarray, warmup: int,
               data_wait_ms: np.ndarray | None = None) -> Iterations:
        """This run's iterations, from ``start`` on (a run that resumed marks its first one)."""
        iteration = np.arange(start, start + len(latency_ms), dtype=np.int64)
        resumed = np.zeros(len(iteration), dtype=bool)
        if start > 0 and len(resumed):
            resumed[0] = True
        wait = np.zeros(len(iteration)) if data_wait_ms is None else np.asarray(data_wait_ms, np.float64)
        return cls(iteration, np.asarray(latency_ms, np.float64), np.asarray(loss, np.float64),
                   iteration < warmup, resumed, wait)

    @classmethod
    def empty(cls) -> Iterations:
        return cls.of_run(0, np.zeros(0), np.zeros(0), 0)

    def __len__(self) -> int:
        return len(self.iteration)

    def then(self, later: Iterations) -> Iterations:
        """These rows before ``later``'s first iteration, followed by ``later``."""
        keep = self.iteration < (later.iteration[0] if len(later) else np.iinfo(np.int64).max)
        return Iterations(*(np.concatenate([getattr(self, c)[keep], getattr(later, c)])
                            for c in ITERATION_COLUMNS))

    def measured_ms(self, column: str = "latency_ms") -> np.ndarray:
        """The latencies (or another column) the statistics are over: neither warm-up nor the first
        after a resume (when that leaves none: every iteration but the first after a resume, then every one)."""
        values: np.ndarray = getattr(self, column)
        for rows in (~self.warmup & ~self.resumed, ~self.resumed):
            if rows.any():
                measured: np.ndarray = values[rows]
                return measured
        return values


def latency_stats(latencies_ms: np.ndarray) -> LatencyStats:
    p50, p90, p99 = np.percentile(latencies_ms, [50, 90, 99])
    return LatencyStats(float(p50), float(p90), float(p99), float(np.mean(latencies_ms)))


@dataclass(frozen=True)
class LossStats:
    """The training loss (mean over the ranks) of the run's first and last iteration, and its
    mean over every iteration of the run, warm-up included (over those with a loss: an
    iterations.parquet of an early version, resumed, had none)."""

    first: float
    last: float
    mean: float


def loss_stats(losses: np.ndarray) -> LossStats:
    """Over the iterations with a loss (at least one: ``rec.train.job`` says where there is none)."""
    known = losses[~np.isnan(losses)]
    return LossStats(float(known[0]), float(known[-1]), float(np.mean(known)))


@dataclass(frozen=True)
class Resumed:
    """What a training resumed from another plan's checkpoint (``--resume-from``) carried over."""

    from_plan_id: str
    step: int  # the checkpoint's iteration
    tables_restored: int  # same shape: their rows as they were
    tables_resized: int  # more or fewer rows: the old rows kept
    tables_initialized: int  # added, or of another dim or data type
    reinitialized: tuple[str, ...] = ()  # the tables of another dim or data type
    dense_reinitialized: tuple[str, ...] = ()  # dense parameters whose shape changed


@dataclass(frozen=True)
class DataRead:
    """What a training read: its data (``--data``, or synthetic), how, and how far."""

    source: str  # the --data path as given, or "synthetic"
    rows: int  # rows in the dataset (0: synthetic)
    files: int
    epochs: float  # epochs read by the end, counted in each rank's share (0 for synthetic)
    ids: str  # the --ids policy
    shuffle: bool
    seed: int
    resumed: str | None = None  # where a resume did not read on from its checkpoint's position: why, and where it read


@dataclass(frozen=True)
class TrainMetrics:
    plan_id: str
    world_size: int
    iterations: int
    warmup: int
    batch_size: int  # per rank
    pipeline: str
    model: str
    iteration_latency_ms: LatencyStats
    loss: LossStats
    samples_per_s: float
    applied_sharding: dict[str, str]
    resumed_from: int  # iteration the run resumed at (0: fresh start)
    planned_in_job: bool = False  # shardflow never plans inside the job; kept for auditors
    resume: Resumed | None = None  # --resume-from another plan: what carried over
    # The plan's critical path in its cost model (plan.json metrics.critical_path), beside the
    # latency measured: predicted against measured in one file.
    predicted_critical_path_ms: float | None = None
    # How long the slowest rank waited for its batch per iteration (over the measured iterations).
    data_wait_ms: LatencyStats | None = None
    data: DataRead | None = None
    # The last evaluation (--eval-data): auc, logloss, ne (None where undefined) and samples; and every
    # evaluation of the run in order, each with its iteration.
    eval: dict[str, float | int | None] | None = None
    evaluations: tuple[dict[str, float | int | None], ...] = ()
    # The run whose checkpoint this one resumed from (at ``resumed_from``), when another run's: one
    # that wrote into another output directory (``rec.train.ownership``).
    resumed_run: Run | None = None
    # torchrun's restarts of the ranks before the run ended (a rank failed; --max-restarts): each
    # went on from the newest checkpoint. Absent from the files of earlier versions: 0.
    restarts: int = 0


def read_metrics(out_dir: str | Path) -> TrainMetrics:
    """``OUT/train_metrics.json`` as the training job wrote it; InputError naming every problem of a
    file it did not write (damaged, edited, foreign)."""
    from rec.documents import DocumentError, load_json
    from rec.errors import InputError, Problem
    from rec.input_files import read_text

    path = Path(out_dir) / METRICS_FILE
    try:
        d = load_json(read_text(path, "the training's metrics", MAX_METRICS_BYTES))
    except DocumentError as e:
        raise InputError(f"Cannot read {path}:", [Problem(str(path), str(e))]) from None
    return metrics_from_dict(d, str(path))


MAX_METRICS_BYTES = 64 << 20  # applied_sharding names every table: 100,000 tables stay far below


def metrics_from_dict(d: object, source: str) -> TrainMetrics:
    """Validate train_metrics.json's mapping into ``TrainMetrics``; InputError naming every problem."""
    from rec.validation import validated

    return validated(_read_metrics, d, source, "training metrics")


def _read_metrics(value: object, problems: Problems) -> TrainMetrics | None:
    from rec.validation import finite_number, known_keys, mapping, required

    if not isinstance(value, dict):
        problems.add("", "expected a mapping")
        return None
    m = known_keys(value, [f.name for f in fields(TrainMetrics)], problems)
    required(m, [f.name for f in fields(TrainMetrics) if f.default is MISSING], problems)
    before = len(problems.items)
    latency = _stats(m, "iteration_latency_ms", problems)
    loss = _stats(m, "loss", problems)
    count = {key: problems.take_from(m, key, _count) for key in _COUNTS}
    restarts = problems.take_from(m, "restarts", _count) if m.get("restarts") is not None else 0
    text = {key: problems.take_from(m, key, _text) for key in ("plan_id", "pipeline", "model")}
    samples = problems.take_from(m, "samples_per_s", finite_number)
    predicted = (None if m.get("predicted_critical_path_ms") is None
                 else problems.take("predicted_critical_path_ms", finite_number, m["predicted_critical_path_ms"]))
    block = None if m.get("resume") is None else mapping(m["resume"], problems, "resume")
    resume = None if block is None else _resumed(block, problems.within("resume"))
    wait = _stats(m, "data_wait_ms", problems) if m.get("data_wait_ms") is not None else None
    data_block = None if m.get("data") is None else mapping(m["data"], problems, "data")
    data = None if data_block is None else _data_read(data_block, problems.within("data"))
    last = None if m.get("eval") is None else _evaluation(m["eval"], problems.within("eval"))
    series = m.get("evaluations") or []
    if not isinstance(series, list):
        problems.add("evaluations", "expected a list")
        series = []
    evaluations = [_evaluation(e, problems.within(f"evaluations[{i}]")) for i, e in enumerate(series)]
    resumed_run = None if m.get("resumed_run") is None else _run(m["resumed_run"], problems)
    sharding = m.get("applied_sharding")
    if not isinstance(sharding, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in sharding.items()):
        problems.add("applied_sharding", "expected a mapping of table names to sharding types")
        sharding = {}
    if len(problems.items) > before:
        return None
    counts = {key: int(value or 0) for key, value in count.items()}
    return TrainMetrics(
        plan_id=str(text["plan_id"]), world_size=counts["world_size"], iterations=counts["iterations"],
        warmup=counts["warmup"], batch_size=counts["batch_size"], pipeline=str(text["pipeline"]),
        model=str(text["model"]), iteration_latency_ms=LatencyStats(*latency), loss=LossStats(*loss),
        samples_per_s=float(samples or 0.0), applied_sharding=dict(sharding), resumed_from=counts["resumed_from"],
        planned_in_job=m.get("planned_in_job") is True, resume=resume, predicted_critical_path_ms=predicted,
        data_wait_ms=LatencyStats(*wait) if wait else None, data=data, eval=last,
        evaluations=tuple(e for e in evaluations if e is not None), resumed_run=resumed_run,
        restarts=int(restarts or 0))


_COUNTS = ("world_size", "iterations", "warmup", "batch_size", "resumed_from")
_STATS = {"iteration_latency_ms": ("p50", "p90", "p99", "mean"), "loss": ("first", "last", "mean"),
          "data_wait_ms": ("p50", "p90", "p99", "mean")}
EVAL_KEYS = ("iteration", "samples")  # besides one key per metric (rec.evaluation.metrics.METRICS)


def _stats(m: dict[str, Any], key: str, problems: Problems) -> list[float]:
    from rec.validation import finite_number, mapping

    block = mapping(m.get(key), problems, key)
    if block is None:
        return []
    within = problems.within(key)
    return [float(within.take_from(block, name, finite_number) or 0.0) for name in _STATS[key]]


def _resumed(block: Any, problems: Problems) -> Resumed | None:
    from rec.validation import text_list

    before = len(problems.items)
    step, restored, resized, initialized = (problems.take_from(block, key, _count)
                                            for key in ("step", "tables_restored", "tables_resized",
                                                        "tables_initialized"))
    plan_id = problems.take_from(block, "from_plan_id", _text)
    tables = problems.take_from(block, "reinitialized", text_list) if "reinitialized" in block else ()
    dense = problems.take_from(block, "dense_reinitialized", text_list) if "dense_reinitialized" in block else ()
    if len(problems.items) > before:
        return None
    return Resumed(str(plan_id), int(step or 0), int(restored or 0), int(resized or 0), int(initialized or 0),
                   tuple(tables or ()), tuple(dense or ()))


def _run(value: object, problems: Problems) -> Run | None:
    from rec.errors import InputError
    from rec.train.ownership import RUN_FORMAT, parse_run

    if not isinstance(value, dict):
        problems.add("resumed_run", "expected a mapping")
        return None
    try:
        return parse_run(json.dumps({"format": RUN_FORMAT, **value}), "resumed_run")
    except InputError as e:
        for problem in e.problems:
            problems.add(f"resumed_run.{problem.where}", problem.reason)
        return None


def _data_read(block: Any, problems: Problems) -> DataRead | None:
    from rec.validation import finite_number, known_keys, required

    names = [f.name for f in fields(DataRead)]
    d = known_keys(block, names, problems)
    required(d, [f.name for f in fields(DataRead) if f.default is MISSING], problems)
    before = len(problems.items)
    source = problems.take_from(d, "source", _text)
    rows, files, seed = (problems.take_from(d, k, _count) for k in ("rows", "files", "seed"))
    epochs = problems.take_from(d, "epochs", finite_number)
    ids = problems.take_from(d, "ids", _text)
    resumed = problems.take_from(d, "resumed", _text) if d.get("resumed") is not None else None
    if not isinstance(d.get("shuffle"), bool):
        problems.add("shuffle", "expected true or false")
    if len(problems.items) > before:
        return None
    return DataRead(str(source), int(rows or 0), int(files or 0), float(epochs or 0.0), str(ids),
                    bool(d["shuffle"]), int(seed or 0), None if resumed is None else str(resumed))


def _evaluation(value: object, problems: Problems) -> dict[str, float | int | None] | None:
    """One evaluation's mapping: its counts and each metric (a finite number, or null)."""
    from rec.evaluation.metrics import METRICS
    from rec.validation import finite_number, known_keys

    if not isinstance(value, dict):
        problems.add("", "expected a mapping")
        return None
    d = known_keys(value, [*EVAL_KEYS, *(m.name for m in METRICS)], problems)
    before = len(problems.items)
    out: dict[str, float | int | None] = {k: problems.take_from(d, k, _count) for k in EVAL_KEYS if k in d}
    out.update({m.name: problems.take_from(d, m.name, finite_number) for m in METRICS})
    return None if len(problems.items) > before else out


def _count(value: object) -> int:
    from rec.validation import integer

    return integer(value, minimum=0)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("expected text")
    return value


def write_metrics(out_dir: str | Path, metrics: TrainMetrics, iterations: Iterations) -> None:
    """train_metrics.json and iterations.parquet, each replaced whole."""
    write_iterations(out_dir, iterations, metrics.evaluations)
    out = Path(out_dir)
    write_whole(out / METRICS_FILE, (json.dumps(asdict(metrics), indent=2) + "\n").encode())


EvaluationRow = dict[str, float | int | None]  # as train_metrics.json holds it: iteration, samples, metrics


def _eval_columns() -> dict[str, str]:
    """iterations.parquet's column of each key of an evaluation but its iteration (the row's)."""
    from rec.evaluation.metrics import METRICS

    return {key: f"eval_{key}" for key in ("samples", *(m.name for m in METRICS))}


def write_iterations(out_dir: str | Path, iterations: Iterations, evaluations: Sequence[EvaluationRow] = ()) -> None:
    """iterations.parquet: ``iterations``, and each of ``evaluations`` in the ``eval_*`` columns of the row
    of the iteration it came after (null in the other rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    after = {int(e["iteration"] or 0) - 1: e for e in evaluations}  # the row an evaluation came after
    # Built from arrays, not a Python value per row: rank 0 rewrites the file at every checkpoint, and
    # a list per column took a second a million rows.
    n = len(iterations.iteration)
    rows = np.searchsorted(iterations.iteration, list(after))
    at = [(int(row), e) for row, (i, e) in zip(rows, after.items(), strict=True)
          if row < n and iterations.iteration[row] == i]
    evaluated = {}
    for key, column in _eval_columns().items():
        kind = np.int64 if key == "samples" else np.float64
        given = [(row, float(value)) for row, e in at if (value := e.get(key)) is not None]
        values, missing = np.zeros(n, kind), np.ones(n, bool)
        values[[row for row, _ in given]] = np.array([value for _, value in given], kind)
        missing[[row for row, _ in given]] = False
        evaluated[column] = pa.array(values, pa.int64() if key == "samples" else pa.float64(), mask=missing)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({
        "iteration": pa.array(iterations.iteration, pa.int64()),
        "latency_ms": pa.array(iterations.latency_ms, pa.float64()),
        "loss": pa.array(iterations.loss, pa.float64()),
        "warmup": pa.array(iterations.warmup, pa.bool_()),
        "resumed": pa.array(iterations.resumed, pa.bool_()),
        "data_wait_ms": pa.array(iterations.data_wait_ms, pa.float64()),
        **evaluated,
    }), sink)
    write_whole(Path(out_dir) / ITERATIONS_FILE, sink.getvalue().to_pybytes())


@dataclass(frozen=True)
class Earlier:
    """What a training kept of its iterations before a resume (``earlier_iterations``)."""

    iterations: Iterations
    evaluations: tuple[EvaluationRow, ...] = ()
    lost: str | None = None  # why rows or evaluations the file held are not kept (None: none lost)


def earlier_iterations(out_dir: str | Path, before: int) -> Earlier:
    """The rows of ``out_dir``'s iterations.parquet before iteration ``before`` and the evaluations
    after them, and why there are none when the file is there but unusable."""
    import pyarrow.parquet as pq

    from rec.validation import Problems

    path = Path(out_dir) / ITERATIONS_FILE
    if not path.exists():
        return Earlier(Iterations.empty())
    try:
        table = pq.read_table(path)
        rows = {c: table.column(c).to_numpy(zero_copy_only=False) for c in ("iteration", "latency_ms", "warmup")}
        # Absent from the files of earlier versions: no loss (NaN, which the loss's statistics pass
        # over), not resumed, no wait.
        loss, resumed, wait = ((table.column(c).to_numpy(zero_copy_only=False) if c in table.column_names
                                else np.full(table.num_rows, fill)) for c, fill in (("loss", np.nan), ("resumed", 0),
                                                                                    ("data_wait_ms", 0)))
        found = Iterations(rows["iteration"].astype(np.int64), rows["latency_ms"].astype(np.float64),
                           loss.astype(np.float64), rows["warmup"].astype(bool), resumed.astype(bool),
                           wait.astype(np.float64))
        evaluated = {key: table.column(column).to_pylist() if column in table.column_names else [None] * len(found)
                     for key, column in _eval_columns().items()}
        columns = set(table.column_names)
    except (OSError, KeyError, ValueError, TypeError) as e:
        return Earlier(Iterations.empty(), lost=f"{path} is unreadable ({type(e).__name__}), its rows are lost")
    keep = found.iteration < before
    if np.any(np.diff(found.iteration[keep]) <= 0):
        return Earlier(Iterations.empty(), lost=f"{path} has its iterations out of order, its rows are dropped")
    kept = Iterations(*(getattr(found, c)[keep] for c in ITERATION_COLUMNS))
    if not columns & set(_eval_columns().values()):  # written before the eval_* columns: train_metrics.json has them
        return _with_older_evaluations(kept, Path(out_dir), before)
    # each checked as train_metrics.json's evaluations are (``_evaluation``)
    problems = Problems(str(path))
    evaluations = tuple(_evaluation({"iteration": int(i) + 1, **{k: values[row] for k, values in evaluated.items()}},
                                    problems)
                        for row, i in enumerate(found.iteration) if keep[row] and evaluated["samples"][row] is not None)
    if problems.items:
        return Earlier(kept, lost=f"{path} holds evaluations that are no counts and finite metrics, they are dropped")
    return Earlier(kept, tuple(e for e in evaluations if e is not None))


def _with_older_evaluations(kept: Iterations, out_dir: Path, before: int) -> Earlier:
    """``kept`` and the evaluations up to iteration ``before`` that train_metrics.json holds: an
    iterations.parquet of an earlier version has no eval_* columns (the last run's evaluations were
    only in train_metrics.json)."""
    from rec.errors import InputError

    if not (out_dir / METRICS_FILE).exists():
        return Earlier(kept)
    try:
        evaluations = read_metrics(out_dir).evaluations
    except InputError:
        return Earlier(kept, lost=f"{out_dir / METRICS_FILE} is unreadable, the evaluations before the checkpoint "
                                  "are lost")
    return Earlier(kept, tuple(e for e in evaluations if int(e["iteration"] or 0) <= before))
