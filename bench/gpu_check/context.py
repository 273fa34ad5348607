"""What the sections of the GPU check share: the ranks, where files go, the time left, and what one
section leaves for the next (the trained plan, the calibrated profile)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.gpu_check.machine import Finished, shardflow
from bench.gpu_check.targets import Target
from bench.gpu_check.workloads import Ranks, Workload


class SectionFailed(Exception):
    """The section failed; the message is its report's reason (one line)."""


class Skipped(Exception):
    """The section did not run; the message says why."""


@dataclass(frozen=True)
class Outcome:
    """What a section found: its figures, one line for a person, and its targets (met or not)."""

    figures: dict[str, Any]
    summary: str
    targets: tuple[Target, ...] = ()


@dataclass
class Context:
    ranks: Ranks
    out: Path  # the report's directory
    deadline: float  # time.monotonic() by which every section has finished
    log: Path  # every command's output
    train_plan: Path | None = None  # the train section's plan (measure and resume use it)
    # (plan, out dir, iterations, its other flags) of a run with checkpoints
    checkpointed: tuple[Path, Path, int, list[str]] | None = None
    profile: Path | None = None  # the calibrated profile
    overhead_s: float = 1.0  # a measured plan's set-up, warm-up and release, per the calibration
    notes: dict[str, Any] = field(default_factory=dict)
    given: tuple[Workload, ...] = ()  # the user's workloads (--specs): calibration and vs_torchrec run them
    builtin: bool = True  # the check's own workloads too (without --specs, or with --also-builtin)

    @property
    def work(self) -> Path:
        path = self.out / "work"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def share(self, fraction: float, at_least: float) -> float:
        """Seconds for a section: ``fraction`` of what is left, at least ``at_least``; Skipped when
        not even that is left."""
        left = self.left()
        if left < at_least:
            raise Skipped(f"the --minutes budget was spent ({max(left, 0):.0f} s left, this section needs "
                          f"at least {at_least:.0f} s)")
        return max(at_least, fraction * left)

    def run(self, args: list[str], timeout_s: float, module: str = "flows.cli") -> Finished:
        """The shardflow command (or ``python -m module``); SectionFailed unless it exits 0."""
        finished = shardflow(args, self.work, min(timeout_s, max(self.left(), 1.0)), self.log, module)
        if finished.code != 0:
            what = f"shardflow {args[0]}" if module == "flows.cli" else module
            raise SectionFailed(f"{what} exited {finished.code}: {finished.cause}")
        return finished

    def topology_file(self, name: str, batch_size: int, hbm_bytes: int | None = None) -> Path:
        path = self.work / f"{name}.topology.yaml"
        path.write_text(yaml.safe_dump(self.ranks.topology(batch_size, hbm_bytes), sort_keys=False))
        return path

    def spec_file(self, workload: Workload) -> Path:
        path = self.work / f"{workload.name}.spec.yaml"
        path.write_text(yaml.safe_dump({"tables": workload.rows}, sort_keys=False))
        return path


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SectionFailed(f"cannot read {path.name}: {e}") from None
    if not isinstance(data, dict):
        raise SectionFailed(f"{path.name} holds no JSON object")
    return data
