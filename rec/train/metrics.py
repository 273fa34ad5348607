"""Iteration latency and loss statistics, and the files rank 0 writes: train_metrics.json,
iterations.parquet (one row per iteration: latency of the slowest rank, mean loss over the ranks)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

METRICS_FILE = "train_metrics.json"
ITERATIONS_FILE = "iterations.parquet"


@dataclass(frozen=True)
class LatencyStats:
    p50: float
    p90: float
    p99: float
    mean: float


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


def write_metrics(out_dir: str | Path, metrics: TrainMetrics, iterations: np.ndarray,
                  latencies_ms: np.ndarray, losses: np.ndarray, warmup: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / METRICS_FILE).write_text(json.dumps(asdict(metrics), indent=2) + "\n")
    table = pa.table({
        "iteration": pa.array(iterations, pa.int64()),
        "latency_ms": pa.array(latencies_ms, pa.float64()),
        "loss": pa.array(losses, pa.float64()),
        "warmup": pa.array(iterations < warmup, pa.bool_()),
    })
    pq.write_table(table, out / ITERATIONS_FILE)
