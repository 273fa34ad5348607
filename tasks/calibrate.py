"""``shardflow calibrate``: measure probe plans on the topology's ranks and fit a hardware profile.

The probes (``rec.calibrate.probes``) are planned for the topology, written under the run's work
directory, and measured in ONE launch of the measuring job (starting torch and torchrec costs
seconds per process), each ``rounds`` times. On cuda a probe's model is built and sharded once and
its rounds are blocks of that build (building costs more than a GPU's iterations, whose timing is
steady). On cpu every round builds it again, the probes in another order each round: a burst of load
on shared cores then hits one measurement of a probe, not all (with the machine loaded, blocks of
one build left the fit 15.2% off the probes, rebuilt rounds 5.7%: bench/RESULTS.md §8). A probe's
time is the median over its rounds of the critical path (the slowest rank's). The fit
(``rec.calibrate.fit``) then gives the profile; only once it succeeds are the profile and its fit
report written, each whole: a failed calibration leaves no profile behind.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rec import progress
from rec.calibrate.fit import Fit, Measured, fit_profile
from rec.calibrate.probes import Probe, probe_plans
from rec.config.cost import CostConfig
from rec.disk_full import write_whole
from rec.errors import InputError, Problem
from rec.file_lock import file_lock
from rec.plan.io import write_plan
from rec.profile import dumps_profile, profile_hash
from rec.settings import MAX_TIME_LIMIT_S, check, knob, to_dict
from rec.sharding import ComputeDevice
from rec.topology import Topology, read_topology, topology_to_dict
from rec.train.measure_config import MeasureConfig
from rec.train.timings import Status, Timings
from rec.units import counted
from tasks.launch import MEASURE_RDZV_ID
from tasks.measure import Ranks, run_measuring_job

FIT_SUFFIX = ".fit.json"  # the fit report beside the profile: profile.yaml -> profile.fit.json
FIT_FORMAT = "shardflow.calibration/v1"
LOCK_SUFFIX = ".lock"  # .PROFILE.yaml.lock beside the profile: held while a calibration writes it
QUICK_ITERATIONS = 10
CPU_ITERATIONS = 20
CUDA_ITERATIONS = 12
PROBES_DIR = "probes"


@dataclass(frozen=True)
class CalibrateSettings:
    quick: bool = field(default=False, metadata=knob(
        "about half the probes, one round, fewer iterations: a rough profile in about a minute on 2 cpu ranks"))
    rounds: int | None = field(default=None, metadata=knob(
        "times each probe is measured (cuda: blocks of one build; cpu: a build each, in another order each "
        "round); the median is fitted; none: 3, with --quick 1", minimum=1, maximum=20))
    iterations: int | None = field(default=None, metadata=knob(
        f"timed iterations per probe and round (--quick: at most {QUICK_ITERATIONS}); none: {CPU_ITERATIONS} on "
        f"cpu, {CUDA_ITERATIONS} on cuda (CUDA events time a GPU's iterations steadily)", minimum=1, maximum=10_000))
    settle_s: float = field(default=MeasureConfig.settle_s, metadata=knob(
        "cuda: at most this many seconds per probe of further warm-up until the GPU's clocks settle",
        minimum=0.0, maximum=600.0, metavar="SECONDS"))
    warmup: int = field(default=3, metadata=knob("untimed iterations before them", minimum=0, maximum=10_000))
    time_limit_s: float = field(default=30.0, metadata=knob(
        "seconds one probe may take: its timed iterations stop there; a probe whose warm-up and first "
        "iteration take longer is left out of the fit", flag="time-limit", above=0.0, maximum=MAX_TIME_LIMIT_S,
        metavar="SECONDS"))
    seed: int = field(default=0, metadata=knob("random seed of the synthetic ids and of the probe order"))
    name: str | None = field(default=None, metadata=knob(
        "the profile's name; none: 'calibrated on' and the device's name", metavar="NAME"))
    ranks: Ranks = field(default_factory=Ranks)
    # Testing: measure only the first N probes (too few to fit a profile; the command then fails).
    max_probes: int | None = field(default=None, metadata=knob("measure only the first N probes", cli=False,
                                                                minimum=1))

    def problems(self) -> list[Problem]:
        return self.ranks.problems()

    def measure_config(self, device: ComputeDevice) -> MeasureConfig:
        iterations = self.iterations or (CUDA_ITERATIONS if device is ComputeDevice.CUDA else CPU_ITERATIONS)
        iterations = min(iterations, QUICK_ITERATIONS) if self.quick else iterations
        blocks = self.round_count if device is ComputeDevice.CUDA else 1  # cpu: a round is a build of its own
        return MeasureConfig(iterations=iterations * blocks, warmup=self.warmup, blocks=blocks,
                             settle_s=self.settle_s, seed=self.seed, time_limit_s=self.time_limit_s)

    @property
    def round_count(self) -> int:
        return self.rounds or (1 if self.quick else 3)


@dataclass(frozen=True)
class ProbeResult:
    name: str
    plan_id: str
    rounds_ms: tuple[float, ...]  # the critical path of each round that measured it


@dataclass(frozen=True)
class Calibrated:
    profile_path: str | None  # None on a node other than 0 (node 0 fits and writes)
    fit_path: str | None
    work_dir: str
    fit: Fit | None
    probes: tuple[ProbeResult, ...]
    timed_out: tuple[str, ...]  # probes no round measured
    seconds: float


def fit_path_for(profile_path: str | Path) -> Path:
    path = Path(profile_path)
    return path.with_name(path.stem + FIT_SUFFIX)


def calibrate(topology_path: str, profile_path: str, work_dir: str,
              settings: CalibrateSettings = CalibrateSettings()) -> Calibrated:
    """Measure the probes on ``topology_path``'s ranks and write the fitted profile to
    ``profile_path`` (node 0); InputError for bad settings or a fit the measurements cannot give
    (nothing written then), MeasureFailed if a rank failed."""
    started = time.perf_counter()
    topology = checked_inputs(topology_path, profile_path, settings)
    with _writing(profile_path):
        return _calibrate(topology_path, topology, profile_path, work_dir, settings, started)


@contextmanager
def _writing(profile_path: str) -> Iterator[None]:
    """This calibration alone writes ``profile_path`` (and its fit report): a second one into the same
    file is refused at once, before it measures anything, instead of both writing a pair of files
    that may describe different fits."""
    lock = Path(profile_path).with_name(f".{Path(profile_path).name}{LOCK_SUFFIX}")
    try:
        with file_lock(lock, blocking=False, removed=True):
            yield
    except BlockingIOError:
        raise InputError("Cannot calibrate into this file:", [Problem(
            f"--out {profile_path}", "another shardflow calibrate is writing it now; wait for it, or write "
                                     "another file")]) from None


def _calibrate(topology_path: str, topology: Topology, profile_path: str, work_dir: str,
               settings: CalibrateSettings, started: float) -> Calibrated:
    with progress.step("probes", "planning the probes"):
        probes = probe_plans(topology, settings.quick)[: settings.max_probes]
        paths = _write_probes(probes, work_dir)
    # cuda: one build of each probe, its rounds as blocks of iterations (measure_config)
    order = _order(len(probes), settings.round_count if topology.compute_device is ComputeDevice.CPU else 1,
                   settings.seed)
    ranks = topology.world_size
    with progress.step("measure", f"{counted(len(probes), 'probe')} x {counted(settings.round_count, 'round')} on "
                                  f"{counted(ranks, 'rank')}"):
        config = settings.measure_config(topology.compute_device)
        timings = run_measuring_job([paths[i] for i in order], topology, work_dir, config,
                                    settings.ranks, MEASURE_RDZV_ID)
    if timings is None:
        return Calibrated(None, None, work_dir, None, (), (), time.perf_counter() - started)
    results = _results(probes, order, timings)
    timed_out = tuple(r.name for r in results if not r.rounds_ms)
    with progress.step("fit", f"fitting the profile to {len(results) - len(timed_out)} probes"):
        measured = [Measured(r.name, p.plan, float(np.median(r.rounds_ms)) if r.rounds_ms else float("nan"))
                    for r, p in zip(results, probes, strict=True)]
        name = settings.name or f"calibrated on {timings.machine.device_name}"
        fit = fit_profile(measured, topology, CostConfig().caching_ratio, name=name, machine=timings.machine)
    # The profile first, then its report: a report on disk always describes the profile beside it
    # (its profile_hash), even when the calibration is stopped between the two writes.
    fit_file = fit_path_for(profile_path)
    write_whole(Path(profile_path), dumps_profile(fit.profile))
    write_whole(fit_file, json.dumps(_fit_report(fit, results, timed_out, topology_path, topology, profile_path,
                                                 settings), indent=1) + "\n")
    return Calibrated(profile_path, str(fit_file), work_dir, fit, results, timed_out, time.perf_counter() - started)


def checked_inputs(topology_path: str, profile_path: str, settings: CalibrateSettings) -> Topology:
    """The topology; InputError naming every problem of the settings, the output file and the topology
    at once."""
    from rec.errors import Collected

    found = Collected()
    found.run(lambda: check(settings, "Cannot calibrate with these settings:"))
    found.run(lambda: _check_output(profile_path))
    topology = found.run(lambda: read_topology(topology_path))
    found.raise_if_any()
    assert topology is not None
    return topology


def _check_output(profile_path: str) -> None:
    path = Path(profile_path)
    problems = []
    if path.suffix.lower() not in (".yaml", ".yml"):
        problems.append(Problem(f"--out {profile_path}", "the profile is YAML: give a .yaml or .yml file name"))
    if path.is_dir():
        problems.append(Problem(f"--out {profile_path}", "is a directory; give the profile's file name"))
    elif not path.parent.is_dir():
        problems.append(Problem(f"--out {profile_path}", f"no directory {path.parent} to write it into"))
    if problems:
        raise InputError("Cannot calibrate into this file:", problems)


def _write_probes(probes: tuple[Probe, ...], work_dir: str) -> list[str]:
    return [str(write_plan(p.plan, Path(work_dir, PROBES_DIR, f"{i:03d}_{p.name}"))) for i, p in enumerate(probes)]


def _order(count: int, rounds: int, seed: int) -> list[int]:
    """Probe indices, every probe once per round, each round in another seeded order: a drift of the
    machine over the run (heat, load) falls on probes of every kind, not on one sweep."""
    order = list(range(count))
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        rng.shuffle(order)
        out += order
    return out


def _results(probes: tuple[Probe, ...], order: list[int], timings: Timings) -> tuple[ProbeResult, ...]:
    """Per probe, the critical path of each round: each measurement's blocks (cuda), or each
    measurement (cpu: one block each)."""
    rounds: list[list[float]] = [[] for _ in probes]
    for i, times in zip(order, timings.plans, strict=True):
        if times.status is Status.MEASURED:
            slowest = int(times.rank_ms().argmax())
            rounds[i] += [float(v) for v in times.block_ms()[slowest]]
    return tuple(ProbeResult(p.name, p.plan.plan_id, tuple(r)) for p, r in zip(probes, rounds, strict=True))


def _fit_report(fit: Fit, results: tuple[ProbeResult, ...], timed_out: tuple[str, ...], topology_path: str,
                topology: Topology, profile_path: str, settings: CalibrateSettings) -> dict[str, Any]:
    """The fit report (docs/profile.md, "Calibration"): per probe measured, predicted and residual; per
    fitted number its relative standard error (null: none, at 0 or undetermined)."""
    by_name = {p.name: p for p in fit.probes}
    probes = []
    for r in results:
        row: dict[str, Any] = {"name": r.name, "plan_id": r.plan_id, "rounds_ms": list(r.rounds_ms)}
        if r.name in by_name:
            p = by_name[r.name]
            row.update(measured_ms=p.measured_ms, predicted_ms=p.predicted_ms, residual=p.error)
        probes.append(row)
    machine = fit.profile.machine
    return {
        "format": FIT_FORMAT, "profile": str(profile_path), "profile_hash": profile_hash(fit.profile),
        "topology": {"path": str(topology_path), "hash": topology.topology_hash, **topology_to_dict(topology)},
        "machine": None if machine is None else {**asdict(machine), "device": machine.device.value},
        "settings": to_dict(settings), "fitted": fit.values, "left_out": list(fit.left_out),
        "relative_errors": {k: None if e is None or not np.isfinite(e) else e for k, e in fit.relative_errors.items()},
        "poorly_determined": list(fit.poorly_determined),
        "median_abs_residual": fit.median_abs_error, "max_abs_residual": fit.max_abs_error,
        "timed_out": list(timed_out), "probes": probes,
    }
