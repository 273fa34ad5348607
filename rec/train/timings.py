"""What the measuring job (``rec.train.measure_job``) hands back: per plan, every rank's timed
iterations, forward and backward, in ``OUT/timings.json`` (rank 0 writes it, whole, at the end).

No torch here: the launcher and the fit read it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from rec.disk_full import write_whole
from rec.profile.types import Machine
from rec.sharding import ComputeDevice

TIMINGS_FILE = "timings.json"
TIMINGS_FORMAT = "shardflow.timings/v1"


class Status(StrEnum):
    MEASURED = "measured"
    TIMED_OUT = "timed_out"  # the warm-up and first timed iteration took longer than --time-limit


@dataclass(frozen=True)
class PlanTimes:
    """One plan's timed iterations, ms, ``[rank][iteration]``: forward (input distribution, lookup,
    output distribution) and backward (gradient distribution, lookup backward with the fused
    optimizer, data_parallel all-reduce)."""

    plan_path: str
    plan_id: str
    status: Status
    warmup: int
    fwd_ms: tuple[tuple[float, ...], ...]
    bwd_ms: tuple[tuple[float, ...], ...]

    @property
    def iterations(self) -> int:
        return len(self.fwd_ms[0]) if self.fwd_ms else 0

    def total_ms(self) -> np.ndarray:
        """(ranks, iterations): forward plus backward of each iteration."""
        total: np.ndarray = np.asarray(self.fwd_ms, dtype=np.float64) + np.asarray(self.bwd_ms, dtype=np.float64)
        return total


@dataclass(frozen=True)
class Timings:
    machine: Machine  # where the job ran (a profile's ``machine`` block)
    plans: tuple[PlanTimes, ...]


def write_timings(out_dir: str | Path, timings: Timings) -> Path:
    """``OUT/timings.json``, replaced whole."""
    path = Path(out_dir) / TIMINGS_FILE
    machine = {**asdict(timings.machine), "device": timings.machine.device.value}
    data = {"format": TIMINGS_FORMAT, "machine": machine,
            "plans": [{**asdict(p), "status": p.status.value} for p in timings.plans]}
    write_whole(path, json.dumps(data) + "\n")
    return path


def read_timings(out_dir: str | Path) -> Timings:
    """What ``write_timings`` wrote; ValueError for anything else (a damaged or foreign file)."""
    path = Path(out_dir) / TIMINGS_FILE
    try:
        d = json.loads(path.read_text())
        if d.get("format") != TIMINGS_FORMAT:
            raise ValueError(f"not {TIMINGS_FORMAT}")
        machine = Machine(**{**d["machine"], "device": ComputeDevice(d["machine"]["device"])})
        plans = tuple(_plan_times(p) for p in d["plans"])
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a timings file the measuring job wrote: {e}") from None
    return Timings(machine, plans)


def _plan_times(p: dict[str, Any]) -> PlanTimes:
    def grid(values: Any) -> tuple[tuple[float, ...], ...]:
        rows = tuple(tuple(float(v) for v in row) for row in values)
        if len({len(r) for r in rows}) > 1 or not all(math.isfinite(v) and v >= 0 for r in rows for v in r):
            raise ValueError("ranks timed different iteration counts, or a time is not a number")
        return rows

    return PlanTimes(str(p["plan_path"]), str(p["plan_id"]), Status(p["status"]), int(p["warmup"]),
                     grid(p["fwd_ms"]), grid(p["bwd_ms"]))
