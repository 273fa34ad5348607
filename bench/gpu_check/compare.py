"""Plans measured side by side on the same ranks, each several times in alternating order, in one
launch: the ``calibration`` section (predicted against measured, under TorchRec's default profile and
the calibrated one) and the ``vs_torchrec`` section (TorchRec's planners against shardflow's).

Planning happens in this process (no torch on shardflow's path; TorchRec's planners import it), the
measuring in ``bench.gpu_check.measure_plans``.
"""

from __future__ import annotations

import math
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu_check import families, workloads
from bench.gpu_check.context import Context, Outcome, SectionFailed, Skipped
from bench.gpu_check.machine import TimedOut
from bench.gpu_check.targets import target
from bench.gpu_check.workloads import Workload
from rec.config.cost import CostConfig
from rec.plan.load_factors import load_factors
from rec.plan.types import Plan
from rec.profile.types import DEFAULT_PROFILE, Profile
from rec.sharding import ComputeKernel
from rec.train.measure_config import MeasureConfig
from rec.train.timings import PlanTimes

GPU_SIZED_MS = 15.0  # a calibration workload's batch doubles until its predicted iteration reaches this
MAX_DOUBLINGS = 6
MAX_BATCH = 1 << 20
MAX_IDS = 40_000_000  # per rank and batch: the synthetic batches the measuring job keeps on the GPU
LAUNCH_S = {True: 30.0, False: 12.0}  # starting the measuring job's ranks, cuda / cpu


def measuring(cuda: bool) -> MeasureConfig:
    """Enough iterations for blocks of tens of ms on a GPU, few on the cpu (the check's budget)."""
    if cuda:
        return MeasureConfig(iterations=40, warmup=4, blocks=5, time_limit_s=60.0)
    return MeasureConfig(iterations=4, warmup=1, blocks=2, settle_s=0.0, time_limit_s=60.0)


@dataclass(frozen=True)
class Planned:
    key: str  # workload/label
    workload: Workload
    label: str  # default, calibrated, torchrec, torchrec-dp, ...
    plan: Plan | None
    path: Path | None
    plan_s: float
    error: str | None = None


def _topology(ctx: Context, batch_size: int, hbm_bytes: int | None) -> Any:
    from rec.topology import topology_from_dict

    return topology_from_dict(ctx.ranks.topology(batch_size, hbm_bytes), source="gpu check")


def _spec(workload: Workload) -> Any:
    from rec.spec import spec_from_rows

    return spec_from_rows(workload.rows, source=workload.name)


def _write(ctx: Context, plan: Plan, name: str) -> Path:
    from rec.plan.io import write_plan

    return Path(write_plan(plan, ctx.work / "plans" / name))


def _shardflow(workload: Workload, topology: Any, profile: Profile) -> Plan:
    from rec.planning import plan_spec

    return plan_spec(_spec(workload), topology, CostConfig(profile=profile))


def predicted(plan: Plan, profile: Profile) -> float:
    from rec.analysis.rank_times import predicted_ms

    return float(predicted_ms(plan, profile).max())


def sized(ctx: Context, workload: Workload, profile: Profile) -> Workload:
    """On cuda, ``workload`` with its batch doubled until the plan's iteration is predicted (under
    ``profile``) to take ``GPU_SIZED_MS``, within the synthetic ids' memory; unchanged on cpu, and
    a user's workload (``--specs``) as its file says."""
    if not ctx.ranks.cuda or workload.given:
        return workload
    from rec.errors import InputError

    ids_per_sample = sum(float(r.get("pooling_factor", 1.0)) * len(r.get("feature_names") or [0])
                         for r in workload.rows)
    fits = None
    for _ in range(MAX_DOUBLINGS):
        try:
            plan = _shardflow(workload, _topology(ctx, workload.batch_size, workload.hbm_bytes), DEFAULT_PROFILE)
        except InputError:
            if fits is None:
                raise
            return fits  # a memory-tight workload's buffers outgrew its HBM cap: the last batch that fit
        fits = workload
        too_many = 2 * workload.batch_size * ids_per_sample * ctx.ranks.world_size > MAX_IDS * ctx.ranks.world_size
        if predicted(plan, profile) >= GPU_SIZED_MS or too_many or workload.batch_size * 2 > MAX_BATCH:
            break
        workload = replace(workload, batch_size=workload.batch_size * 2)
    return workload


def builtin_names(ranks: workloads.Ranks) -> set[str]:
    """The names of the check's own workloads on ``ranks`` (a given workload's must differ)."""
    drawn = [*workloads.calibration_workloads(ranks, len(workloads.CALIBRATION_SPECS)),
             *families.out_of_family(ranks).workloads, *workloads.torchrec_shapes(ranks)]
    return {w.name for w in drawn}


def _order(count: int, repeats: int) -> list[int]:
    """Each plan once per repeat: in order, then reversed, then shuffled (seeded): alternating, so
    that a drift of the machine falls on every plan alike."""
    out, rng = [], random.Random(0)
    for r in range(repeats):
        order = list(range(count))
        if r % 2:
            order.reverse()
        if r >= 2:
            rng.shuffle(order)
        out += order
    return out


@dataclass(frozen=True)
class Measured:
    """Per plan, its measurements; ``stopped``: why the launch ended before measuring them all (its
    plans not reached are failed with that cause), None when it finished."""

    per_plan: list[list[PlanTimes]]
    stopped: str | None = None


def measure_alternating(ctx: Context, paths: Sequence[Path], repeats: int, timeout_s: float,
                        config: MeasureConfig | None = None) -> Measured:
    """Every plan at ``paths`` measured ``repeats`` times in one launch (``config``; default: the
    check's ``measuring``). A launch that fails or runs past ``timeout_s`` keeps what it measured
    before (the job writes its timings as it goes); SectionFailed or TimedOut where it measured
    nothing."""
    from rec.settings import to_flags
    from rec.train.timings import Status, read_timings

    order = _order(len(paths), repeats)
    out = ctx.work / f"measured-{int(time.time() * 1000) % 10**9}"
    config = config or measuring(ctx.ranks.cuda)
    stopped = None
    try:
        ctx.run(["--out", str(out), *to_flags(config), *[str(paths[i]) for i in order]], timeout_s,
                module="bench.gpu_check.measure_plans")
        done = list(read_timings(out).plans)
    except (SectionFailed, TimedOut) as e:
        try:
            done = list(read_timings(out).plans)
        except (OSError, ValueError):
            raise e from None
        if not done:
            raise
        if len(done) < len(order):  # a failure after the last plan (its release) loses nothing
            stopped = clipped(str(e))
            cause = f"the measuring launch ended before it: {stopped}"
            done += [PlanTimes(str(paths[i]), "", Status.FAILED, 0, (), (), error=cause) for i in order[len(done):]]
    per_plan: list[list[PlanTimes]] = [[] for _ in paths]
    for i, times in zip(order, done, strict=True):
        per_plan[i].append(times)
    return Measured(per_plan, stopped)


def repeat_spread(values: list[float]) -> float:
    """The noise of repeated measurements: (max - min) / median (0 for one)."""
    return float((max(values) - min(values)) / np.median(values))


def summarize(runs: list[PlanTimes]) -> dict[str, Any]:
    """A plan's measurements: the median critical path over the repeats, each repeat's, and their spread."""
    values = [t.critical_path_ms() for t in runs if t.iterations]
    if not values:  # with the measuring job's cause (e.g. a rank out of memory), where it gave one
        return {"measured_ms": math.nan, "repeats_ms": [], "spread": math.nan, "block_spread": math.nan,
                "measure_error": next((t.error for t in runs if t.error), None)}
    median = float(np.median(values))
    return {"measured_ms": median, "repeats_ms": [round(v, 4) for v in values],
            "spread": repeat_spread(values),
            "block_spread": float(max(t.spread() for t in runs if t.iterations))}


# Bytes of uvm tables the measuring job sets up per second: on one H200 (2026-11-26, run e) plans
# with 11.5-12.1 GB of them took 4.9-9.1 s to build, those without 0.02-0.5 s.
HOST_INIT_BYTES_PER_S = 2e9


def _estimate(ctx: Context, plans: Sequence[Plan], profile: Profile, repeats: int,
              config: MeasureConfig | None = None) -> float:
    """Seconds the measuring job should take for ``plans``, each ``repeats`` times, with a margin."""
    config = config or measuring(ctx.ranks.cuda)
    # GPU-sized tables (GBs) take longer to build than most probes': half a second more each.
    overhead = ctx.overhead_s + (0.5 if ctx.ranks.cuda else 0.0)
    return 1.3 * sum(repeats * (overhead + _plan_seconds(p, profile, config)) for p in plans)


def _plan_seconds(plan: Plan, profile: Profile, config: MeasureConfig) -> float:
    """One measurement of ``plan`` after the common set-up: its uvm tables built on the host, the
    warm-up (as long as the caches take to fill, ``rec.train.synthetic_pool``) and the timed blocks,
    which the job stops starting past ``config.time_limit_s``."""
    from rec.train.measure_job import block_sizes
    from rec.train.synthetic_pool import synthetic_pool

    pool = synthetic_pool(plan, config.synthetic_batches)
    iteration_s = predicted(plan, profile) / 1e3
    warmup_s = (max(config.warmup, pool.fill_iterations) + (8 if config.settle_s else 0)) * iteration_s
    sizes = block_sizes(config, pool.batches)
    timed_s = sum(sizes) * iteration_s
    build_s = max(plan.metrics.rank_ddr, default=0) / HOST_INIT_BYTES_PER_S
    return build_s + min(warmup_s + timed_s, max(config.time_limit_s, warmup_s) + max(sizes, default=0) * iteration_s)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    import warnings

    from scipy.stats import spearmanr

    if len(a) < 3:
        return math.nan
    with warnings.catch_warnings():  # constant values: no rank correlation, NaN
        warnings.simplefilter("ignore")
        return float(spearmanr(a, b)[0])


def calibration(ctx: Context) -> Outcome:
    """GPU-sized workloads (the check's own, the user's ``--specs``, or both; beside the check's own,
    the out-of-family ones, ``bench.gpu_check.families``), each planned under TorchRec's default
    profile and the calibrated one (or ``--profile``); every plan measured in alternating repeats;
    each profile's error and rank correlation, per workload by its name and per group, and the
    targets: the calibrated profile's median |error|, Spearman and the repeats' median spread over
    the given and built-in plans, and its median |error| and Spearman over the out-of-family ones."""
    from rec.errors import InputError
    from rec.profile import read_profile

    if ctx.profile is None:
        raise Skipped("needs the calibrated profile (or --profile), and the calibrate section did not make one")
    cuda = ctx.ranks.cuda
    budget = ctx.share(0.5, 90 if cuda else 40)
    calibrated = read_profile(ctx.profile)
    repeats = 3 if cuda else 2
    started = time.monotonic()
    entries: list[dict[str, Any]] = []
    plans: list[Plan] = []
    builtin = (workloads.calibration_workloads(ctx.ranks, len(workloads.CALIBRATION_SPECS) if cuda else 2)
               if ctx.builtin else [])
    oof = families.out_of_family(ctx.ranks) if ctx.builtin else families.OutOfFamily((), {})
    candidates = [*ctx.given, *_beside(builtin, list(oof.workloads))]
    not_planned: dict[str, str] = {}  # the given and out-of-family workloads shardflow could not plan here
    too_long: dict[str, str] = {}  # workloads whose measuring alone would not fit the budget
    for workload in candidates:
        try:
            workload = sized(ctx, workload, calibrated)
            topology = _topology(ctx, workload.batch_size, workload.hbm_bytes)
            pair = [_shardflow(workload, topology, DEFAULT_PROFILE), _shardflow(workload, topology, calibrated)]
        except InputError as e:
            if workload.group == "builtin":
                raise
            not_planned[workload.name] = clipped(e.render())  # a finding, not the end of the section
            continue
        spent = time.monotonic() - started
        needed = spent + LAUNCH_S[cuda] + _estimate(ctx, plans + pair, calibrated, repeats)
        if needed > budget and plans:  # a smaller workload further on may still fit
            if spent + LAUNCH_S[cuda] > budget:
                break
            continue
        if needed > budget:  # alone: its measuring job would run past the section's budget and lose every plan
            too_long[workload.name] = (f"measuring its plans would take about {needed:.0f} s, more than the "
                                       f"section's {budget:.0f} s (--minutes)")
            continue
        for made_under, plan in zip(("default", "calibrated"), pair, strict=True):
            plans.append(plan)
            entries.append({"spec": workload.name, "given": workload.given, "group": workload.group,
                            "family": workload.family, "tables": len(workload.rows),
                            "batch_size": workload.batch_size, "made_under": made_under, "plan_id": plan.plan_id,
                            "sharding": _mix(plan),
                            "predicted_default_ms": predicted(plan, DEFAULT_PROFILE),
                            "predicted_calibrated_ms": predicted(plan, calibrated)})
    passed_over = {**not_planned, **too_long}  # the workloads not measured before the launch, and why
    if not plans:
        if ctx.given:
            return none_measured(ctx, "the --minutes budget did not reach it", passed_over)
        raise SectionFailed("no workload could be planned and measured: "
                            + "; ".join(f"{k}: {v}" for k, v in passed_over.items()))
    paths = [_write(ctx, p, f"{e['spec']}_{e['made_under']}") for p, e in zip(plans, entries, strict=True)]
    try:
        measured = measure_alternating(ctx, paths, repeats, max(30.0, budget - (time.monotonic() - started)))
    except (SectionFailed, TimedOut) as e:
        if not ctx.given:
            raise
        return launch_failed(ctx, e, passed_over)
    for entry, runs in zip(entries, measured.per_plan, strict=True):
        entry.update(summarize(runs))
        for model in ("default", "calibrated"):
            entry[f"error_{model}"] = entry[f"predicted_{model}_ms"] / entry["measured_ms"] - 1
    ok = [e for e in entries if math.isfinite(e["measured_ms"])]
    measured_names = {e["spec"] for e in entries}
    causes = {e["spec"]: e["measure_error"] for e in entries if e.get("measure_error")}
    missing = _not_measured(ctx.given, ok, passed_over, measured_names, causes)
    if len(ok) < 2:
        failure = SectionFailed(f"only {len(ok)} of {len(entries)} plans were measured"
                                + (f" ({next(iter(causes.values()))})" if causes else ""))
        if not missing:
            raise failure
        # too few to judge: the plans measured kept, the workloads none of whose plans was named
        kept: dict[str, Any] = {"plans_measured": ok, "workloads": _by_workload(entries), "given_not_measured": missing,
                                **({"launch_error": measured.stopped} if measured.stopped else {})}
        return Outcome(kept, f"{failure}{_missing_line(missing)}{_stopped_line(measured.stopped)}",
                       (target("given_not_measured", float(len(missing)), cuda),))
    values = [e["measured_ms"] for e in ok]
    # The calibration_* targets and ``summary`` judge the given and built-in plans, as before the
    # out-of-family set existed; that set has targets of its own.
    judged = [e for e in ok if e["group"] != "out_of_family"]
    apart = [e for e in ok if e["group"] == "out_of_family"]
    summary = _accuracy(judged)
    groups = {name: _accuracy(rows) for name in ("given", "builtin", "out_of_family")
              if (rows := [e for e in ok if e["group"] == name])}
    spreads = [e["spread"] for e in ok]
    judged_spread = float(np.median([e["spread"] for e in judged])) if judged else math.nan
    figures = {"specs": len({e["spec"] for e in ok}), "plans": len(ok), "repeats": repeats,
               "profile": str(ctx.profile), "min_measured_ms": min(values),
               "below_10_ms": list(dict.fromkeys(e["spec"] for e in ok if e["measured_ms"] < 10.0)),
               "max_spread": max(spreads), "median_spread": judged_spread,
               "summary": summary, "by_group": groups, "choices": _choices(ok, {p.plan_id: layout(p) for p in plans}),
               "plans_measured": entries, "workloads": _by_workload(entries),
               "left_out": [w.name for w in candidates if w.name not in measured_names and w.name not in not_planned],
               "given": {w.name: _given(w) for w in ctx.given}, "given_not_measured": missing}
    if measured.stopped:
        figures["launch_error"] = measured.stopped
    if ctx.builtin:
        figures["out_of_family"] = _apart(oof, apart, {k: v for k, v in not_planned.items() if k not in missing})
    cal = summary["calibrated"]
    targets = (target("calibration_median_abs_error", cal["median_abs_error"], cuda),
               target("calibration_median_abs_log_ratio", cal["median_abs_log_ratio"], cuda),
               *((target("calibration_spearman", cal["spearman"], cuda),)
                 if rankable(judged, "predicted_calibrated_ms") else ()),
               target("calibration_median_spread", figures["median_spread"], cuda),
               *((target("given_not_measured", float(len(missing)), cuda),) if ctx.given else ()))
    line = _missing_line(missing) + _stopped_line(measured.stopped)
    if ctx.builtin:
        far = groups.get("out_of_family", {}).get("calibrated", {"median_abs_error": math.nan, "spearman": math.nan})
        targets += (target("out_of_family_median_abs_error", far["median_abs_error"], cuda),
                    *((target("out_of_family_spearman", far["spearman"], cuda),)
                      if rankable(apart, "predicted_calibrated_ms") else ()))
        line += (f"; out of family {len(apart)} plans: median |error| {far['median_abs_error']:.1%}, "
                 f"Spearman {far['spearman']:.2f}")
    return Outcome(figures, f"{len(judged)} plans of {len({e['spec'] for e in judged})} specs: calibrated median "
                            f"|error| {cal['median_abs_error']:.1%}, Spearman {cal['spearman']:.2f} (defaults "
                            f"{summary['default']['median_abs_error']:.0%}, {summary['default']['spearman']:.2f}); "
                            f"spread up to {max(spreads):.1%}{line}", targets)


def _given(workload: Workload) -> dict[str, Any]:
    """What the report says of a given workload: its file and what it ran with."""
    return {"file": workload.source, "tables": len(workload.rows), "batch_size": workload.batch_size,
            "hbm_cap": workload.hbm_bytes}


def _not_measured(given: Sequence[Workload], measured: list[dict[str, Any]], not_planned: dict[str, str],
                  reached: set[str], causes: dict[str, str]) -> dict[str, str]:
    """Per given workload with no plan measured: why."""
    done = {e["spec"] for e in measured}
    return {w.name: not_planned.get(w.name) or (measurement_failed(causes.get(w.name)) if w.name in reached
                                                else "the --minutes budget did not reach it")
            for w in given if w.name not in done}


def measurement_failed(cause: str | None) -> str:
    """Why a plan has no measurement: the measuring job's cause where it gave one."""
    return f"its measurement failed: {clipped(cause)}" if cause else "its measurement failed (commands.log)"


def launch_failed(ctx: Context, error: Exception, not_planned: dict[str, str]) -> Outcome:
    """A section whose measuring failed as a whole (its one launch failed or ran out of time, or too
    few plans were measured to judge): every given workload named with that cause (or why it was not
    planned or measured, ``not_planned``), and the ``given_not_measured`` target missed."""
    cause = clipped(str(error))
    outcome = none_measured(ctx, f"the measuring launch failed: {cause}", not_planned)
    return replace(outcome, figures={**outcome.figures, "launch_error": cause})


def none_measured(ctx: Context, cause: str, known: dict[str, str]) -> Outcome:
    """A section that measured none of the given workloads: each named with its own reason where
    ``known`` has one, else ``cause``; the ``given_not_measured`` target missed."""
    missing = {w.name: known.get(w.name) or cause for w in ctx.given}
    headline = cause if any(w.name not in known for w in ctx.given) else "none of the given workloads was measured"
    return Outcome({"given_not_measured": missing}, f"{headline}{_missing_line(missing)}",
                   (target("given_not_measured", float(len(missing)), ctx.ranks.cuda),))


def _missing_line(missing: dict[str, str]) -> str:
    """The workloads not measured, each with the start of its reason (the report has all of it): of a
    refused input, its first problem."""
    def brief(why: str) -> str:
        line = one_line(why)
        title, listed, first = line.partition(" - ")  # a refusal: "Title: - where: problem - ..."
        return clipped(first if listed and title.endswith(":") else line, MISSING_CLIP)

    return f"; not measured: {', '.join(f'{name} ({brief(why)})' for name, why in missing.items())}" if missing else ""


def _stopped_line(stopped: str | None) -> str:
    return f"; the measuring launch ended early ({stopped}): the plans after it were not measured" if stopped else ""


def one_line(text: str) -> str:
    """``text`` on one line: its whitespace runs, newlines included, as one space (a table cell, a summary)."""
    return " ".join(text.split())


CLIP = 400  # characters of a cause in a report: TorchRec's and the planner's errors run to pages
MISSING_CLIP = 120  # characters of why a workload was not measured, in the section's one line


def clipped(text: str, limit: int = CLIP) -> str:
    """``text`` on one line, cut after a word within ``limit`` characters, ``...`` marking the cut."""
    line = one_line(text)
    if len(line) <= limit:
        return line
    return line[:limit - 3].rsplit(" ", 1)[0] + "..."


def _beside(builtin: list[Workload], oof: list[Workload]) -> list[Workload]:
    """The built-in workloads with the out-of-family set's first round (one per family) between
    them, its later rounds after them: a budget that reaches only some workloads still reaches both
    sets, and the built-in ones before the second round."""
    first = len({w.family for w in oof})  # families.out_of_family orders its workloads round by round
    head, rest = oof[:first], oof[first:]
    out: list[Workload] = []
    for i, workload in enumerate(builtin):
        out += [workload, *head[i:i + 1]]
    return out + head[len(builtin):] + rest


def _apart(oof: families.OutOfFamily, measured: list[dict[str, Any]], not_planned: dict[str, str]) -> dict[str, Any]:
    """The out-of-family set's own figures: what it is, what was measured of it, what was not."""
    spreads = [e["spread"] for e in measured]
    return {"seeds": f"{families.OOF_SEEDS.start}-{families.OOF_SEEDS.stop - 1}",
            "families": sorted({w.family for w in oof.workloads if w.family}),
            "workloads": {w.name: {"family": w.family, "tables": len(w.rows), "hbm_cap": w.hbm_bytes,
                                   "table_bytes": sum(int(r["num_embeddings"]) * int(r["embedding_dim"]) * 4
                                                      for r in w.rows)} for w in oof.workloads},
            "plans": len(measured), "median_spread": float(np.median(spreads)) if spreads else math.nan,
            "by_family": _by_family(measured), "skipped": oof.skipped, "not_planned": not_planned}


def _by_family(measured: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per family measured, the calibrated profile's errors: how many plans, the median |error| and the
    median signed error (below 0: predicted too fast), where a missed target comes from."""
    out: dict[str, dict[str, Any]] = {}
    for family in sorted({str(e["family"]) for e in measured}):
        errors = [e["error_calibrated"] for e in measured if str(e["family"]) == family]
        out[family] = {"plans": len(errors), "median_abs_error": float(np.median(np.abs(errors))),
                       "median_error": float(np.median(errors))}
    return out


def _accuracy(entries: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each profile's median |error| and Spearman over ``entries`` (measured plans)."""
    values = [e["measured_ms"] for e in entries]
    return {model: {"median_abs_error": float(np.median([abs(e[f"error_{model}"]) for e in entries])),
                    "median_abs_log_ratio": float(np.median([abs(_log_ratio(e[f"error_{model}"])) for e in entries])),
                    "spearman": spearman([e[f"predicted_{model}_ms"] for e in entries], values)}
            for model in ("default", "calibrated")}


def _log_ratio(error: float) -> float:
    """ln(predicted / measured) of an error ``predicted / measured - 1``: too fast and too slow alike."""
    return math.log(1 + error) if 1 + error > 0 else -math.inf


def rankable(entries: list[dict[str, Any]], predicted: str) -> bool:
    """Whether a rank correlation says something of ``entries``: 3 plans or more, neither their
    ``predicted`` times nor their measured ones all equal (one plan given twice, or only ties, has none)."""
    return len(entries) > 2 and all(len({e[key] for e in entries}) > 1 for key in (predicted, "measured_ms"))


def _by_workload(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per workload name, each of its plans' predicted (under both profiles) and measured times."""
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        out.setdefault(e["spec"], {})[e["made_under"]] = {
            "plan_id": e["plan_id"], "measured_ms": e.get("measured_ms"), "spread": e.get("spread"),
            "predicted_default_ms": e["predicted_default_ms"], "predicted_calibrated_ms": e["predicted_calibrated_ms"]}
    return out


NOISE_FLOOR = {True: 0.02, False: 0.25}  # below these, cuda's and the shared cpu's repeats do not tell plans apart


def _verdict(ratio: float, noise: float, same_layout: bool, cuda: bool) -> str:
    """Against TorchRec's plan: the same layout, or faster/slower beyond the two measurements' noise
    (their repeats' spread, at least ``NOISE_FLOOR``)."""
    if same_layout:
        return "same layout"
    if not (math.isfinite(ratio) and math.isfinite(noise)):
        return "not measured"
    noise = max(noise, NOISE_FLOOR[cuda])
    return "faster" if ratio < 1 - noise else "slower" if ratio > 1 + noise else "same within noise"


def layout(plan: Plan) -> tuple[Any, ...]:
    """What DMP does with a plan: every table's sharding type, kernel and shards, and a fused_uvm_caching
    table's cache size (its load factor, TorchRec's default where the plan gives none). Plans of
    different planners (different plan_ids) with one layout are measured once."""
    factor = dict(zip((t.key for t in plan.spec.tables), load_factors(plan).tolist(), strict=True))
    return tuple((t.key, t.sharding_type, t.compute_kernel, tuple((s.rank, s.offsets, s.sizes) for s in t.shards),
                  factor[t.key] if t.compute_kernel is ComputeKernel.FUSED_UVM_CACHING else None)
                 for t in plan.tables)


def _mix(plan: Plan) -> dict[str, int]:
    mix: dict[str, int] = {}
    for t in plan.tables:
        mix[t.sharding_type.value] = mix.get(t.sharding_type.value, 0) + 1
    return mix


def _choices(entries: list[dict[str, Any]], layouts: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Per spec: the plan chosen under the calibrated profile against the one chosen under the defaults
    (``same plan``: one layout, ``layouts`` by plan_id; their plan_ids differ by the profile)."""
    out = []
    for spec in dict.fromkeys(e["spec"] for e in entries):
        pair = {e["made_under"]: e for e in entries if e["spec"] == spec}
        if len(pair) < 2:
            continue
        d, c = pair["default"], pair["calibrated"]
        noise = max(d["spread"], c["spread"])
        ratio = c["measured_ms"] / d["measured_ms"]
        verdict = ("same plan" if layouts[d["plan_id"]] == layouts[c["plan_id"]] else "faster" if ratio < 1 - noise
                   else "slower" if ratio > 1 + noise else "same within noise")
        out.append({"spec": spec, "ratio": ratio, "noise": noise, "verdict": verdict})
    return out


# TorchRec's planners and shardflow's, as the comparison names them.
PLANNERS = ("torchrec", "torchrec-dp", "shardflow", "shardflow-calibrated")


def _plan_with(name: str, workload: Workload, topology: Any, calibrated: Profile | None) -> Plan:
    if name == "shardflow":
        return _shardflow(workload, topology, DEFAULT_PROFILE)
    if name == "shardflow-calibrated":
        if calibrated is None:
            raise Skipped("no calibrated profile")
        return _shardflow(workload, topology, calibrated)
    from rec.config.planner_identity import Planner
    from rec.sharding import ComputeDevice
    from rec.torchrec import torchrec_plan

    proposer = Planner(name)
    if proposer is Planner.TORCHREC_DP and topology.compute_device is ComputeDevice.CPU:
        raise Skipped("TorchRec's DP proposer does not plan for cpu ranks")
    plan: Plan = torchrec_plan(_spec(workload), topology, CostConfig(), proposer)
    return plan


MIN_TORCHREC_PLAN_S = 10.0  # a TorchRec planner's time on a shape when the planning share is spent


class PlanningTimedOut(BaseException):
    """A planner ran past its time (a BaseException: TorchRec's ``except Exception`` must not swallow it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """PlanningTimedOut in this (main) thread after ``seconds``; no limit elsewhere or where infinite."""
    if not math.isfinite(seconds) or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise PlanningTimedOut(f"did not finish within {seconds:.0f} s (the section's planning share)")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def plan_shapes(ctx: Context, shapes: Sequence[Workload], calibrated: Profile | None,
                write: Callable[[Plan, str], Path], planning_s: float = math.inf) -> list[Planned]:
    """Every shape planned by every planner; a planner that finds no plan is recorded, not fatal.
    TorchRec's planners take minutes for hundreds of tables on 8 ranks: they get what is left of
    ``planning_s`` (at least ``MIN_TORCHREC_PLAN_S``), then are stopped, and are not started once it
    is spent; both are recorded too."""
    out = []
    until = time.monotonic() + planning_s
    for workload in shapes:
        topology = _topology(ctx, workload.batch_size, workload.hbm_bytes)
        for name in PLANNERS:
            began = time.perf_counter()
            limit = max(MIN_TORCHREC_PLAN_S, until - time.monotonic()) if name.startswith("torchrec") else math.inf
            if name.startswith("torchrec") and time.monotonic() >= until:
                out.append(Planned(f"{workload.name}/{name}", workload, name, None, None, 0.0,
                                   f"{name}'s planner was not run: the section's planning share was spent"))
                continue
            try:
                with time_limit(limit):
                    plan = _plan_with(name, workload, topology, calibrated)
            except Skipped:
                continue
            except PlanningTimedOut as e:
                out.append(Planned(f"{workload.name}/{name}", workload, name, None, None,
                                   time.perf_counter() - began, f"{name}'s planner {e}"))
                continue
            except Exception as e:  # TorchRec's planner failing on a shape is a result
                out.append(Planned(f"{workload.name}/{name}", workload, name, None, None,
                                   time.perf_counter() - began, clipped(f"{type(e).__name__}: {e}")))
                continue
            seconds = time.perf_counter() - began
            out.append(Planned(f"{workload.name}/{name}", workload, name, plan,
                               write(plan, f"{workload.name}_{name}"), seconds))
    return out


def _first_errors(planned: Sequence[Planned], but: set[str]) -> dict[str, str]:
    """Per shape not in ``but`` (none of whose planners gave a plan): its first planner's error."""
    why: dict[str, str] = {}
    for p in planned:
        if p.workload.name not in but:
            why.setdefault(p.workload.name, one_line(p.error or ""))
    return why


class NotReached(Skipped):
    """No planned shape's measuring fits the time left; ``why``: the shapes no planner could plan."""

    def __init__(self, message: str, why: dict[str, str]):
        super().__init__(message)
        self.why = why


class NotPlanned(SectionFailed):
    """No shape could be planned by any planner; ``why``: per shape, its first planner's error."""

    def __init__(self, why: dict[str, str]):
        super().__init__("no shape could be planned: " + "; ".join(f"{k}: {v}" for k, v in why.items()))
        self.why = why


@dataclass(frozen=True)
class Comparison:
    repeats: int
    shapes: dict[str, Any]  # per shape name, per planner: its figures
    stopped: str | None = None  # why the measuring launch ended before measuring every plan


def compare_measured(ctx: Context, shapes: Sequence[Workload], repeats: int, timeout_s: float,
                     config: MeasureConfig | None = None) -> Comparison:
    """The repeats and the comparison's figures: per shape and planner, plan time and measured iteration
    time with its spread and its ratio to TorchRec's default planner's plan (a shape's plans of one
    layout measured once). Fewer repeats (not below 2), then only the shapes, in order, whose plans
    still fit the time (a later, smaller one may where an earlier does not) where the time would not
    do; Skipped where none does."""
    from rec.profile import read_profile

    calibrated = read_profile(ctx.profile) if ctx.profile else None
    began = time.monotonic()
    planned_by_all = plan_shapes(ctx, shapes, calibrated, lambda plan, name: _write(ctx, plan, name), timeout_s / 2)
    # Keyed by the shape too: one layout at two shapes' batch sizes is two measurements.
    unique: dict[tuple[Any, ...], Planned] = {}
    for p in planned_by_all:
        if p.plan is not None and p.path is not None:
            unique.setdefault((p.workload.name, layout(p.plan)), p)
    left = timeout_s - (time.monotonic() - began) - LAUNCH_S[ctx.ranks.cuda]
    profile = calibrated or DEFAULT_PROFILE

    def estimate(names: set[str]) -> float:
        return _estimate(ctx, [p.plan for p in unique.values() if p.plan and p.workload.name in names], profile,
                         repeats, config)

    planned = {p.workload.name for p in unique.values()}
    while repeats > 2 and estimate(planned) > left:
        repeats -= 1
    kept: set[str] = set()
    for shape in shapes:
        if shape.name in planned and estimate(kept | {shape.name}) <= left:
            kept.add(shape.name)
    if planned and not kept:
        raise NotReached(f"measuring even one shape {repeats} times would take longer than the "
                         f"{max(left, 0):.0f} s left of the --minutes budget", _first_errors(planned_by_all, planned))
    shapes = [s for s in shapes if s.name in kept or not any(p.workload.name == s.name for p in unique.values())]
    unique = {k: p for k, p in unique.items() if p.workload.name in kept}
    layouts = list(unique)
    paths = [p.path for p in unique.values() if p.path is not None]
    if not paths:
        raise NotPlanned(_first_errors(planned_by_all, set()))
    measured = measure_alternating(ctx, paths, repeats, timeout_s - (time.monotonic() - began), config)
    by_layout = {key: summarize(runs) for key, runs in zip(layouts, measured.per_plan, strict=True)}
    result: dict[str, Any] = {}
    for workload in shapes:
        rows = {p.label: p for p in planned_by_all if p.workload.name == workload.name}
        base = rows.get("torchrec")
        base_m = by_layout[(workload.name, layout(base.plan))] if base and base.plan else None
        base_ms = base_m["measured_ms"] if base_m else math.nan
        entry: dict[str, Any] = {"tables": len(workload.rows), "batch_size": workload.batch_size}
        if workload.given:
            entry["file"] = workload.source
        for label, p in rows.items():
            if p.plan is None:
                entry[label] = {"plan_s": round(p.plan_s, 3), "error": p.error}
                continue
            m = by_layout[(workload.name, layout(p.plan))]
            same = [q.label for q in rows.values()
                    if q.plan is not None and q is not p and layout(q.plan) == layout(p.plan)]
            ratio = m["measured_ms"] / base_ms if base_ms else math.nan
            noise = max(m["spread"], base_m["spread"]) if base_m else math.nan
            entry[label] = {"plan_s": round(p.plan_s, 3), "plan_id": p.plan.plan_id, "sharding": _mix(p.plan),
                            "same_layout_as": same, **m, "vs_torchrec": ratio,
                            "verdict": "reference" if label == "torchrec" else
                            "no TorchRec plan" if base_m is None else
                            _verdict(ratio, noise, "torchrec" in same, ctx.ranks.cuda)}
        result[workload.name] = entry
    return Comparison(repeats, result, measured.stopped)


def builtin_shapes(ranks: workloads.Ranks) -> list[Workload]:
    """The check's own shapes in the order the budget reaches them: on cuda ``memory_tight`` first (a
    budget that reaches one shape reaches the one where memory decides), on cpu the two that plan and
    measure in seconds."""
    shapes = workloads.torchrec_shapes(ranks)
    if not ranks.cuda:
        return [s for s in shapes if s.name in ("few_big", "mixed_ebc_ec")]
    return sorted(shapes, key=lambda s: s.name != "memory_tight")


def vs_torchrec(ctx: Context) -> Outcome:
    """TorchRec's planners' plans (default proposers, DP proposer) and shardflow's (default and
    calibrated profile), measured on these ranks in alternating repeats, on the check's shapes, the
    user's ``--specs``, or both. Target: no shape where shardflow's calibrated plan (its default one
    without a profile) measured slower than TorchRec's beyond the noise."""
    cuda = ctx.ranks.cuda
    budget = ctx.share(1.0, 90 if cuda else 40)
    builtin = builtin_shapes(ctx.ranks) if ctx.builtin else []
    try:
        compared = compare_measured(ctx, [*ctx.given, *builtin], 3 if cuda else 2, budget)
    except NotPlanned as e:
        if not ctx.given:
            raise
        reasons = {k: f"not planned: {clipped(v)}" for k, v in e.why.items()}
        return none_measured(ctx, "no planner could plan it", reasons)
    except NotReached as e:
        if not ctx.given:
            raise
        reasons = {k: f"not planned: {clipped(v)}" for k, v in e.why.items()}
        return none_measured(ctx, f"the --minutes budget did not reach it ({e})", reasons)
    except (SectionFailed, TimedOut) as e:
        if not ctx.given:
            raise
        return launch_failed(ctx, e, {})
    repeats, results = compared.repeats, compared.shapes
    geomeans = {label: _geomean([row[label]["vs_torchrec"] for row in results.values()
                                 if isinstance(row.get(label), dict) and "vs_torchrec" in row[label]])
                for label in ("shardflow", "shardflow-calibrated")}
    ours = "shardflow-calibrated" if ctx.profile else "shardflow"
    slower = [name for name, row in results.items()
              if isinstance(row.get(ours), dict) and row[ours].get("verdict") == "slower"]
    missing = {w.name: why for w in ctx.given if (why := _judged_missing(results.get(w.name), ours))}
    given = {w.name for w in ctx.given}
    not_judged = {name: why for name, row in results.items()  # TorchRec's plan measured, ours not
                  if name not in given and _judged_missing(row, "torchrec") is None
                  and (why := _judged_missing(row, ours))}
    # A shape TorchRec's planner gave no plan for: shardflow's is not slower, but nothing was compared.
    not_compared = {name: clipped(str(row["torchrec"]["error"])) for name, row in results.items()
                    if isinstance(row.get("torchrec"), dict) and row["torchrec"].get("error")}
    figures = {"repeats": repeats, "shapes": results, "vs_torchrec_geomean": geomeans, "judged": ours,
               "slower_than_torchrec": slower, "given_not_measured": missing, "not_compared": not_compared,
               "not_judged_beside_torchrec": not_judged}
    if compared.stopped:
        figures["launch_error"] = compared.stopped
    judged = sum(1 for row in results.values() if isinstance(row.get(ours), dict)
                 and math.isfinite(row[ours].get("vs_torchrec", math.nan)))
    shapes = f"{judged} of {len(results)} shape{'s' if len(results) != 1 else ''}"
    default, calibrated = geomeans["shardflow"], geomeans.get("shardflow-calibrated", math.nan)  # none: no profile
    return Outcome(figures, f"{shapes} measured against TorchRec's plan (geometric mean): shardflow's "
                            + (f"{default:.2f}x" if math.isfinite(default) else "none")
                            + (f", calibrated {calibrated:.2f}x" if math.isfinite(calibrated) else "")
                            + (f"; slower on {', '.join(slower)}" if slower else "")
                            + (f"; no TorchRec plan to compare with on {', '.join(not_compared)}" if not_compared
                               else "") + _missing_line(missing) + _stopped_line(compared.stopped)
                            + (f"; {ours} not measured on {', '.join(not_judged)}" if not_judged else ""),
                   (target("slower_than_torchrec", float(len(slower)), cuda),
                    target("not_judged_beside_torchrec", float(len(not_judged)), cuda),
                    *((target("given_not_measured", float(len(missing)), cuda),) if ctx.given else ())))


def _judged_missing(row: dict[str, Any] | None, judged: str) -> str | None:
    """Why a shape's plan by the planner ``judged`` (a label of its row: shardflow's, or TorchRec's) has no
    measurement; None when it has one."""
    if row is None:
        return "the --minutes budget did not reach it"
    mine = row.get(judged)
    if not isinstance(mine, dict):
        return "not planned"
    if mine.get("error"):
        return clipped(str(mine["error"]))
    return None if math.isfinite(mine.get("measured_ms", math.nan)) else measurement_failed(mine.get("measure_error"))


def _geomean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return float(np.exp(np.mean(np.log(finite)))) if finite else math.nan
