"""``shardflow measure``: run a plan's sharded embedding modules on its ranks and compare the time
each rank takes with what the plan predicts (``measure.json``, docs/measure.md).

Before any process starts, the plan and this machine are checked as for training
(``tasks.train.preflight``); then the measuring job (``rec.train.measure_job``) runs under torchrun
through the training launcher (``tasks.launch``: its logs, its failure causes, no process outliving
the command). ``run_measuring_job`` is the launch itself, shared with ``shardflow calibrate``, which
measures many plans in one launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rec import progress
from rec.analysis import check_plan
from rec.errors import InputError, Problem
from rec.plan import plan_file, read_plan
from rec.settings import check
from rec.topology.types import Topology
from rec.train.measure_config import MeasureConfig
from rec.train.measure_report import MeasureReport, measure_report, write_measure
from rec.train.rank_log import log_dir
from rec.train.timings import Status, Timings, read_timings
from rec.units import counted
from tasks.launch import MEASURE_JOB, MEASURE_RDZV_ID, Launch, failure_cause, run_training
from tasks.train import TrainSettings, preflight

MEASURE_KIND = "measure"  # the run's directory: out/<plan_id>/measure-<time>-<random>


def _as_in_training(name: str) -> Any:
    """The field ``name`` of ``TrainSettings`` (the same flag, default, bounds and help)."""
    f = TrainSettings.__dataclass_fields__[name]
    return field(default=f.default, metadata=f.metadata)


@dataclass(frozen=True)
class Ranks:
    """Where the job's processes run: ``shardflow train``'s flags of the same names."""

    nproc_per_node: int | None = _as_in_training("nproc_per_node")
    nnodes: int = _as_in_training("nnodes")
    node_rank: int = _as_in_training("node_rank")
    rdzv_endpoint: str | None = _as_in_training("rdzv_endpoint")
    join_timeout: int = _as_in_training("join_timeout")

    def as_training(self) -> TrainSettings:
        return TrainSettings(nproc_per_node=self.nproc_per_node, nnodes=self.nnodes, node_rank=self.node_rank,
                             rdzv_endpoint=self.rdzv_endpoint, join_timeout=self.join_timeout)

    def problems(self) -> list[Problem]:
        return self.as_training().problems()


@dataclass(frozen=True)
class MeasureSettings:
    job: MeasureConfig = field(default_factory=MeasureConfig)
    ranks: Ranks = field(default_factory=Ranks)

    def problems(self) -> list[Problem]:
        return self.ranks.problems()


@dataclass(frozen=True)
class Measured:
    plan_id: str
    out_dir: str
    report: MeasureReport | None  # None on a node other than 0 (node 0 writes measure.json)
    settings: MeasureSettings
    nproc_per_node: int
    started_ms: int
    plan_path: str = ""  # the plan.json measured


class MeasureFailed(RuntimeError):
    """The measuring job failed (``cause`` in one line), or measured nothing before its time limit."""

    def __init__(self, cause: str, deterministic: bool, logs: str):
        super().__init__(f"{cause} (logs in {logs})")
        self.cause, self.deterministic, self.logs = cause, deterministic, logs

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.cause, self.deterministic, self.logs)


def run_measuring_job(plan_paths: Sequence[str], topology: Topology, out_dir: str, config: MeasureConfig,
                      ranks: Ranks, rdzv_id: str) -> Timings | None:
    """Measure the plans (all for ``topology``'s ranks) in one torchrun launch; their timings on
    node 0, None on the others. InputError for anything that would fail for certain on this
    machine (checked first), MeasureFailed if a rank failed."""
    check(config, "Cannot measure with these settings:")
    nproc = _preflight(ranks, topology)
    launch = Launch(plan_path=plan_paths[0], more_plans=tuple(plan_paths[1:]), out_dir=out_dir,
                    nproc_per_node=nproc, nnodes=ranks.nnodes, node_rank=ranks.node_rank,
                    rdzv_endpoint=ranks.rdzv_endpoint, rdzv_id=rdzv_id, join_timeout_s=ranks.join_timeout,
                    job=config, module=MEASURE_JOB)
    finished = run_training(launch)
    if finished.code != 0:
        cause = failure_cause(launch, finished)
        raise MeasureFailed(cause.text, cause.deterministic, str(log_dir(out_dir)))
    if ranks.node_rank != 0:
        return None
    try:
        return read_timings(out_dir)
    except (OSError, ValueError) as e:
        raise MeasureFailed(f"the measuring job left no usable timings: {e}", False, str(log_dir(out_dir))) from None


def _preflight(ranks: Ranks, topology: Topology) -> int:
    """``tasks.train.preflight`` (the same checks: the job runs on the same ranks), titled for measuring."""
    try:
        return preflight(ranks.as_training(), topology)
    except InputError as e:
        raise InputError("Cannot measure this plan here:", e.problems) from None


def measure(plan_path: str, out_dir: str, settings: MeasureSettings = MeasureSettings()) -> Measured:
    """Measure the plan at ``plan_path`` on its ranks and write OUT/measure.json (node 0)."""
    from tasks.records import now_ms

    started = now_ms()
    check(settings, "Cannot measure with these settings:")
    with progress.step("check", "the plan, and what it needs of this machine"):
        plan = read_plan(plan_path)
        check_plan(plan)
        nproc = _preflight(settings.ranks, plan.topology)
    plan_json = str(plan_file(plan_path))
    ranks = settings.ranks.nnodes * nproc
    with progress.step("measure", f"starting {counted(ranks, 'rank')}"):
        timings = run_measuring_job([plan_json], plan.topology, out_dir, settings.job, settings.ranks, MEASURE_RDZV_ID)
    if timings is None:
        return Measured(plan.plan_id, out_dir, None, settings, nproc, started, plan_json)
    times = timings.plans[0]
    if times.status is Status.FAILED:
        raise MeasureFailed(f"the plan could not be built on its ranks: {times.error}", False, str(log_dir(out_dir)))
    if times.status is Status.TIMED_OUT:
        raise MeasureFailed(f"the warm-up and first timed iteration took longer than --time-limit "
                            f"{settings.job.time_limit_s:g} s: nothing was measured", True, str(log_dir(out_dir)))
    report = measure_report(plan, times, timings.machine)
    write_measure(out_dir, report)
    return Measured(plan.plan_id, out_dir, report, settings, nproc, started, plan_json)
