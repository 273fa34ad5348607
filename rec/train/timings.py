"""What the measuring job (``rec.train.measure_job``) hands back: per plan, every rank's timed
iterations, forward and backward, in ``OUT/timings.json`` (rank 0 writes it, whole, as it goes),
with the blocks they ran in and where the plan's wall time went; or why the plan failed.

No torch here: the launcher and the fit read it. Format v3; v2 files have no failed plans, and v1
files (no blocks, no phases) are read as one block.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from rec.disk_full import write_whole
from rec.documents import DocumentError, load_json
from rec.profile.types import Machine
from rec.sharding import ComputeDevice

TIMINGS_FILE = "timings.json"
TIMINGS_FORMAT = "shardflow.timings/v3"  # v3: a plan may be failed, with its error
READABLE_FORMATS = ("shardflow.timings/v1", "shardflow.timings/v2", TIMINGS_FORMAT)


class Status(StrEnum):
    MEASURED = "measured"
    TIMED_OUT = "timed_out"  # the warm-up and first timed block took longer than --time-limit
    FAILED = "failed"  # building it, sharding it or drawing its batches raised on some rank: see ``error``


@dataclass(frozen=True)
class Phases:
    """Where one plan's wall time went on rank 0, seconds: building and sharding the model (``setup``),
    the warm-up (``warmup_iterations`` of them, the settling blocks included), the timed blocks, and
    releasing the model (``teardown``). ``setup + warmup + teardown`` is what a measurement costs
    beyond its timed iterations."""

    setup_s: float = 0.0
    warmup_s: float = 0.0
    warmup_iterations: int = 0
    timed_s: float = 0.0
    teardown_s: float = 0.0

    @property
    def overhead_s(self) -> float:
        return self.setup_s + self.warmup_s + self.teardown_s


@dataclass(frozen=True)
class PlanTimes:
    """One plan's timed iterations, ms, ``[rank][iteration]``: forward (input distribution, lookup,
    output distribution) and backward (gradient distribution, lookup backward with the fused
    optimizer, data_parallel all-reduce; up to the next iteration's start). The iterations ran in
    ``blocks`` consecutive blocks of (nearly) equal length, on a pool of ``synthetic_batches`` batches
    per rank (0: not recorded) whose ids touched ``touched_over_cache`` x the rows of the least
    covered fused_uvm_caching table's cache (``rec.train.synthetic_pool``; None: no such table).
    A plan that failed has no iterations and its ``error``: ``rank R: Type: message`` of the lowest
    rank it failed on."""

    plan_path: str
    plan_id: str
    status: Status
    warmup: int
    fwd_ms: tuple[tuple[float, ...], ...]
    bwd_ms: tuple[tuple[float, ...], ...]
    blocks: int = 1
    phases: Phases = field(default_factory=Phases)
    synthetic_batches: int = 0
    touched_over_cache: float | None = None
    touch_target_reached: bool | None = None  # every cache's pool reached its target (not the caps)
    error: str | None = None  # why the plan failed (status failed), in one line

    @property
    def iterations(self) -> int:
        return len(self.fwd_ms[0]) if self.fwd_ms else 0

    def total_ms(self) -> np.ndarray:
        """(ranks, iterations): forward plus backward of each iteration."""
        total: np.ndarray = np.asarray(self.fwd_ms, dtype=np.float64) + np.asarray(self.bwd_ms, dtype=np.float64)
        return total

    def block_ms(self) -> np.ndarray:
        """(ranks, blocks): each block's median iteration. A median, not a mean: a host hiccup (one
        iteration of 20 ms among 3-ms ones on a GPU, and the few after it catching up) moves a block's
        mean by tens of percent, its median not."""
        total = self.total_ms()
        parts = np.array_split(np.arange(total.shape[1]), min(self.blocks, max(1, total.shape[1])))
        medians: np.ndarray = np.stack([np.median(total[:, part], axis=1) for part in parts], axis=1)
        return medians

    def rank_ms(self) -> np.ndarray:
        """(ranks,): each rank's iteration time, the median of its blocks' medians."""
        return np.asarray(np.median(self.block_ms(), axis=1))

    def critical_path_ms(self) -> float:
        """The iteration time: the slowest rank's."""
        return float(self.rank_ms().max())

    def spread(self) -> float:
        """The noise of this measurement: on the slowest rank, (slowest block - fastest block) / median
        block (0 with one block)."""
        if self.blocks <= 1:
            return 0.0
        blocks = self.block_ms()[int(self.rank_ms().argmax())]
        return float((blocks.max() - blocks.min()) / np.median(blocks))


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
    """What ``write_timings`` wrote (v1 or v2); ValueError for anything else (a damaged or foreign file)."""
    path = Path(out_dir) / TIMINGS_FILE
    try:
        d: Any = load_json(path.read_text())
        if d.get("format") not in READABLE_FORMATS:
            raise ValueError(f"not {TIMINGS_FORMAT}")
        machine = Machine(**{**d["machine"], "device": ComputeDevice(d["machine"]["device"])})
        plans = tuple(_plan_times(p) for p in d["plans"])
    except (KeyError, TypeError, AttributeError, DocumentError) as e:
        raise ValueError(f"{path} is not a timings file the measuring job wrote: {e}") from None
    return Timings(machine, plans)


def _plan_times(p: dict[str, Any]) -> PlanTimes:
    def grid(values: Any) -> tuple[tuple[float, ...], ...]:
        rows = tuple(tuple(float(v) for v in row) for row in values)
        if len({len(r) for r in rows}) > 1 or not all(math.isfinite(v) and v >= 0 for r in rows for v in r):
            raise ValueError("ranks timed different iteration counts, or a time is not a number")
        return rows

    phases = p.get("phases") or {}
    values = {k: phases[k] for k in ("setup_s", "warmup_s", "warmup_iterations", "timed_s", "teardown_s")
              if k in phases}
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values.values()):
        raise ValueError("a phase's time is not a number")
    blocks = int(p.get("blocks", 1))
    if blocks < 1:
        raise ValueError("blocks must be at least 1")
    seconds = {k: float(v) for k, v in values.items() if k != "warmup_iterations"}
    warmed = int(values.get("warmup_iterations", p["warmup"]))
    ratio, reached = p.get("touched_over_cache"), p.get("touch_target_reached")
    return PlanTimes(str(p["plan_path"]), str(p["plan_id"]), Status(p["status"]), int(p["warmup"]),
                     grid(p["fwd_ms"]), grid(p["bwd_ms"]), blocks, Phases(**seconds, warmup_iterations=warmed),
                     synthetic_batches=int(p.get("synthetic_batches", 0)),
                     touched_over_cache=None if ratio is None else float(ratio),
                     touch_target_reached=None if reached is None else bool(reached),
                     error=None if p.get("error") is None else str(p["error"]))
