"""``measure.json``: a plan's predicted time per rank against what its ranks measured
(docs/measure.md). No torch: the launcher writes it from the job's ``timings.json``.

Predicted: ``rec.analysis.rank_times.predicted_ms`` under the plan's own profile (the one it was planned
under: its ``metrics.rank_perf`` plus that profile's plan-level terms, which TorchRec's default
profile does not have). Measured: each rank's iteration time (the median over the timed blocks of
their mean iteration, ``PlanTimes.rank_ms``) and 90th percentile of forward plus backward over the
timed iterations, and the spread of the blocks (the measurement's noise). The critical path is the
slowest rank, in both; ``error`` is measured / predicted - 1 on it. Beside them, the synthetic pool
the ranks cycled and how far its ids covered the fused_uvm_caching tables' caches
(``rec.train.synthetic_pool``), so a reader sees when a cap left the caches flattered.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rec.analysis.rank_times import predicted_ms
from rec.disk_full import write_whole
from rec.plan.plan_id import plan_profile
from rec.plan.types import Plan
from rec.profile import profile_hash
from rec.profile.types import Machine
from rec.train.timings import PlanTimes

MEASURE_FILE = "measure.json"
MEASURE_FORMAT = "shardflow.measure/v1"


@dataclass(frozen=True)
class MeasureReport:
    format: str
    plan_id: str
    world_size: int
    compute_device: str
    batch_size: int  # per rank, the plan topology's
    profile: dict[str, Any]  # name, hash, default (true: TorchRec's)
    predicted_ms: list[float]  # per rank
    measured_ms: list[float]  # per rank: median over the timed blocks of their mean iteration
    measured_p90_ms: list[float]
    measured_fwd_ms: list[float]  # per rank: medians of forward and of backward alone
    measured_bwd_ms: list[float]
    critical_path_predicted: float
    critical_path_measured: float
    error: float | None  # critical_path_measured / critical_path_predicted - 1 (None: nothing predicted)
    iterations: int  # timed, per rank
    warmup: int
    machine: dict[str, Any]
    measured_at: str | None
    blocks: int = 1  # the timed iterations ran in this many blocks
    spread: float = 0.0  # on the slowest rank: (slowest block - fastest block) / median block
    synthetic_batches: int | None = None  # the pool each rank drew and cycled (None: not recorded)
    touched_over_cache: float | None = None  # the least, over fused_uvm_caching tables, of rows touched / cached
    touch_target_reached: bool | None = None  # false: a cap bound the pool (None: no cached table)


def measure_report(plan: Plan, times: PlanTimes, machine: Machine) -> MeasureReport:
    """The report of one measured plan (``times`` must hold timed iterations)."""
    total = times.total_ms()
    predicted = predicted_ms(plan)
    measured = times.rank_ms()
    profile = plan_profile(plan)
    critical_predicted, critical_measured = float(predicted.max()), float(measured.max())
    return MeasureReport(
        format=MEASURE_FORMAT, plan_id=plan.plan_id, world_size=plan.world_size,
        compute_device=plan.topology.compute_device.value, batch_size=plan.topology.batch_size,
        profile={"name": profile.name, "hash": profile_hash(profile), "default": profile.is_default},
        predicted_ms=_list(predicted), measured_ms=_list(measured),
        measured_p90_ms=_list(np.percentile(total, 90, axis=1)),
        measured_fwd_ms=_list(np.median(np.asarray(times.fwd_ms), axis=1)),
        measured_bwd_ms=_list(np.median(np.asarray(times.bwd_ms), axis=1)),
        critical_path_predicted=critical_predicted, critical_path_measured=critical_measured,
        error=critical_measured / critical_predicted - 1 if critical_predicted > 0 else None,
        iterations=times.iterations, warmup=times.warmup,
        machine={k: (v.value if hasattr(v, "value") else v) for k, v in asdict(machine).items()
                 if k != "measured_at"},
        measured_at=machine.measured_at, blocks=times.blocks, spread=times.spread(),
        synthetic_batches=times.synthetic_batches or None, touched_over_cache=times.touched_over_cache,
        touch_target_reached=times.touch_target_reached,
    )


def _list(values: np.ndarray) -> list[float]:
    return [float(v) for v in values]


def write_measure(out_dir: str | Path, report: MeasureReport) -> Path:
    """``OUT/measure.json``, replaced whole."""
    path = Path(out_dir) / MEASURE_FILE
    write_whole(path, json.dumps(asdict(report), indent=2) + "\n")
    return path
