"""Iteration latency and loss statistics, and the files rank 0 writes: train_metrics.json,
iterations.parquet (one row per iteration: latency of the slowest rank, mean loss over the ranks).

A training that resumes from its own checkpoint keeps the rows of the iterations before it
(``earlier_iterations``), so iterations.parquet holds every iteration of the training; the first
iteration after a resume (cold caches, a fresh pipeline) is marked ``resumed`` and, like the
warm-up, left out of the latency statistics. Both files are replaced whole (written beside, then
renamed): a reader, or a failed write, never sees half a file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rec.disk_full import write_whole

METRICS_FILE = "train_metrics.json"
ITERATIONS_FILE = "iterations.parquet"
ITERATION_COLUMNS = ("iteration", "latency_ms", "loss", "warmup", "resumed")


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

    @classmethod
    def of_run(cls, start: int, latency_ms: np.ndarray, loss: np.ndarray, warmup: int) -> Iterations:
        """This run's iterations, from ``start`` on (a run that resumed marks its first one)."""
        iteration = np.arange(start, start + len(latency_ms), dtype=np.int64)
        resumed = np.zeros(len(iteration), dtype=bool)
        if start > 0 and len(resumed):
            resumed[0] = True
        return cls(iteration, np.asarray(latency_ms, np.float64), np.asarray(loss, np.float64),
                   iteration < warmup, resumed)

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

    def measured_ms(self) -> np.ndarray:
        """The latencies the statistics are over: neither warm-up nor the first after a resume
        (when that leaves none: every iteration but the first after a resume, then every one)."""
        for rows in (~self.warmup & ~self.resumed, ~self.resumed):
            if rows.any():
                measured: np.ndarray = self.latency_ms[rows]
                return measured
        return self.latency_ms


def latency_stats(latencies_ms: np.ndarray) -> LatencyStats:
    p50, p90, p99 = np.percentile(latencies_ms, [50, 90, 99])
    return LatencyStats(float(p50), float(p90), float(p99), float(np.mean(latencies_ms)))


@dataclass(frozen=True)
class LossStats:
    """The training loss (mean over the ranks) of the run's first and last iteration, and its
    mean over every iteration of the run, warm-up included."""

    first: float
    last: float
    mean: float


def loss_stats(losses: np.ndarray) -> LossStats:
    return LossStats(float(losses[0]), float(losses[-1]), float(np.mean(losses)))


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
    # --resume-from another plan: from_plan_id, step, tables_restored, tables_resized,
    # tables_initialized, reinitialized (names of tables whose dim or data type changed)
    resume: dict[str, Any] | None = None
    # The plan's critical path in its cost model (plan.json metrics.critical_path), beside the
    # latency measured: predicted against measured in one file.
    predicted_critical_path_ms: float | None = None


def write_metrics(out_dir: str | Path, metrics: TrainMetrics, iterations: Iterations) -> None:
    """train_metrics.json and iterations.parquet, each replaced whole."""
    write_iterations(out_dir, iterations)
    out = Path(out_dir)
    write_whole(out / METRICS_FILE, (json.dumps(asdict(metrics), indent=2) + "\n").encode())


def write_iterations(out_dir: str | Path, iterations: Iterations) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({
        "iteration": pa.array(iterations.iteration, pa.int64()),
        "latency_ms": pa.array(iterations.latency_ms, pa.float64()),
        "loss": pa.array(iterations.loss, pa.float64()),
        "warmup": pa.array(iterations.warmup, pa.bool_()),
        "resumed": pa.array(iterations.resumed, pa.bool_()),
    }), sink)
    write_whole(Path(out_dir) / ITERATIONS_FILE, sink.getvalue().to_pybytes())


def earlier_iterations(out_dir: str | Path, before: int) -> tuple[Iterations, str | None]:
    """The rows of ``out_dir``'s iterations.parquet before iteration ``before``, and why there are
    none when the file is there but unusable (None: fine, or no file)."""
    import pyarrow.parquet as pq

    path = Path(out_dir) / ITERATIONS_FILE
    if not path.exists():
        return Iterations.empty(), None
    try:
        table = pq.read_table(path)
        rows = {c: table.column(c).to_numpy(zero_copy_only=False) for c in ITERATION_COLUMNS[:4]}
        resumed = (table.column("resumed").to_numpy(zero_copy_only=False) if "resumed" in table.column_names
                   else np.zeros(table.num_rows, dtype=bool))
        found = Iterations(rows["iteration"].astype(np.int64), rows["latency_ms"].astype(np.float64),
                           rows["loss"].astype(np.float64), rows["warmup"].astype(bool), resumed.astype(bool))
    except (OSError, KeyError, ValueError, TypeError) as e:
        return Iterations.empty(), f"{path} is unreadable ({type(e).__name__}), its rows are lost"
    keep = found.iteration < before
    if np.any(np.diff(found.iteration[keep]) <= 0):
        return Iterations.empty(), f"{path} has its iterations out of order, its rows are dropped"
    return Iterations(*(getattr(found, c)[keep] for c in ITERATION_COLUMNS)), None
