"""The sections that run shardflow's own commands, as a user would: ``train`` (both pipelines),
``data``, ``resume``, ``measure`` and ``calibrate``. Each returns its ``Outcome`` (figures, a one-line
summary, its targets: ``bench.gpu_check.targets``), or raises ``SectionFailed``/``Skipped``
(``bench.gpu_check.context``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu_check import compare, workloads
from bench.gpu_check.context import Context, Outcome, SectionFailed, read_json
from bench.gpu_check.targets import target
from rec.train.config import PipelineKind

PIPELINES = (PipelineKind.NAIVE, PipelineKind.SPARSE_DIST)


def _plan(ctx: Context, workload: workloads.Workload, timeout_s: float) -> Path:
    spec = ctx.spec_file(workload)
    topology = ctx.topology_file(workload.name, workload.batch_size, workload.hbm_bytes)
    out = ctx.work / f"{workload.name}_plan"
    ctx.run(["plan", "--no-track", str(spec), "--topology", str(topology), "--out", str(out), "--no-chart"], timeout_s)
    return out


def train(ctx: Context) -> Outcome:
    """The DLRM example trained with each pipeline on every rank; which was faster, and whether
    ``--pipeline auto`` picks it. On cuda each pipeline runs three times, alternating, and its fastest
    run counts: a run slowed by the host (one of run e's ran 1.2x its others) says nothing of the
    pipeline. The pick may be slower by the noise: the larger of the pipelines' spreads between their
    two fastest runs."""
    cuda = ctx.ranks.cuda
    budget = ctx.share(0.25, 90 if cuda else 40)
    workload = workloads.dlrm(ctx.ranks)
    ctx.train_plan = _plan(ctx, workload, budget / 3)
    iterations, warmup, repeats = (300, 50, 3) if cuda else (8, 2, 1)
    figures: dict[str, Any] = {"workload": workload.name, "tables": len(workload.rows),
                               "batch_size": workload.batch_size, "iterations": iterations, "warmup": warmup,
                               "repeats": repeats}
    runs: dict[PipelineKind, list[dict[str, Any]]] = {p: [] for p in PIPELINES}
    for repeat in range(repeats):
        for pipeline in PIPELINES:
            out = ctx.work / (f"train_{pipeline.value}" + (f"_{repeat}" if repeat else ""))
            # On cpu the tables are small: the resume section goes on from this run's checkpoint.
            checkpoints = [] if cuda or pipeline is PipelineKind.NAIVE else ["--checkpoint-every", str(iterations // 2)]
            finished = ctx.run(["train", "--plan", str(ctx.train_plan), "--out", str(out), "--iterations",
                                str(iterations), "--warmup", str(warmup), "--pipeline", pipeline.value, "--no-track",
                                *checkpoints], max(30.0, ctx.left() * 0.4 / (repeats - repeat)))
            if checkpoints:
                ctx.checkpointed = (ctx.train_plan, out, iterations,
                                    ["--warmup", str(warmup), "--pipeline", pipeline.value])
            metrics = read_json(out / "train_metrics.json")
            latency = metrics["iteration_latency_ms"]
            runs[pipeline].append({"p50_ms": latency["p50"], "p90_ms": latency["p90"],
                                   "samples_per_s": metrics["samples_per_s"], "command_s": round(finished.seconds, 1),
                                   "loss_last": metrics["loss"]["last"]})
    for pipeline, done in runs.items():
        figures[pipeline.value] = {**min(done, key=lambda r: r["p50_ms"]), "p50_ms_runs": [r["p50_ms"] for r in done]}
    # the spread of each pipeline's two fastest runs: a run the host slowed aside
    noise = max(compare.repeat_spread(sorted(r["p50_ms"] for r in done)[:2]) for done in runs.values())
    naive, sparse = (figures[p.value]["p50_ms"] for p in PIPELINES)
    faster = PipelineKind.NAIVE if naive < sparse else PipelineKind.SPARSE_DIST
    auto = PipelineKind.AUTO.on(ctx.ranks.world_size, ctx.ranks.device.value)
    picked = figures[auto.value]["p50_ms"] / min(naive, sparse)
    figures.update(faster=faster.value, naive_over_sparse_dist=naive / sparse, auto_picks=auto.value,
                   auto_picks_faster=auto is faster, auto_pick_over_faster=picked, repeat_spread=noise)
    return Outcome(figures, f"p50 naive {naive:.2f} ms, sparse_dist {sparse:.2f} ms ({naive / sparse:.2f}x): "
                            f"{faster.value} faster; auto picks {auto.value} ({picked:.2f}x the faster)",
                   (target("auto_pick_over_faster", picked, cuda, noise),))


def data(ctx: Context) -> Outcome:
    """The train section's DLRM fed from Parquet (``--data``: read, converted and prefetched while
    it trains) against synthetic batches, alternating, same plan and settings: samples/s, and the
    share of the iteration the ranks waited for data. On cuda, Parquet must keep ``DATA_TARGET``
    of the synthetic rate (``parquet_over_synthetic``)."""
    from bench.gpu_check.data import write_parquet

    cuda = ctx.ranks.cuda
    budget = ctx.share(0.25, 90 if cuda else 40)
    workload = workloads.dlrm(ctx.ranks)
    plan = ctx.train_plan or _plan(ctx, workload, budget / 4)
    iterations, warmup, repeats = (300, 50, 2) if cuda else (40, 5, 1)
    rows = min(workload.batch_size * ctx.ranks.world_size * 64, 4_000_000)
    parquet = ctx.work / "data.parquet"
    size = write_parquet(workload, rows, parquet)
    runs: dict[str, list[dict[str, float]]] = {"synthetic": [], "parquet": []}
    for repeat in range(repeats):
        for source in runs:
            out = ctx.work / f"data_{source}_{repeat}"
            fed = ["--data", str(parquet)] if source == "parquet" else []
            ctx.run(["train", "--plan", str(plan), "--out", str(out), "--iterations", str(iterations),
                     "--warmup", str(warmup), "--no-track", *fed], max(30.0, ctx.left() * 0.2))
            metrics = read_json(out / "train_metrics.json")
            wait, latency = metrics.get("data_wait_ms") or {}, metrics["iteration_latency_ms"]
            runs[source].append({"samples_per_s": metrics["samples_per_s"], "p50_ms": latency["p50"],
                                 "wait_p50_ms": wait.get("p50", 0.0), "wait_mean_ms": wait.get("mean", 0.0),
                                 "epochs": (metrics.get("data") or {}).get("epochs", 0.0)})
    rate = {source: float(np.median([r["samples_per_s"] for r in done])) for source, done in runs.items()}
    ratio = rate["parquet"] / rate["synthetic"]
    waited = float(np.median([r["wait_mean_ms"] / r["p50_ms"] for r in runs["parquet"]]))
    figures = {"workload": workload.name, "rows": rows, "parquet_bytes": size, "iterations": iterations,
               "batch_size": workload.batch_size, "runs": runs, "samples_per_s": rate,
               "parquet_over_synthetic": ratio, "wait_mean_over_p50": waited}
    return Outcome(figures, f"{rate['parquet']:,.0f} samples/s from Parquet, {rate['synthetic']:,.0f} synthetic "
                            f"({ratio:.2f}x); waited for data {waited:.1%} of the iteration",
                   (target("parquet_over_synthetic", ratio, cuda),))


def resume(ctx: Context) -> Outcome:
    """A training that checkpoints and stops, then one that resumes from its newest checkpoint (on
    cpu the train section's checkpointed run; on cuda a DLRM of 1 GB of tables, whose checkpoint is
    quick to write), against an unbroken training over the same iterations: the resumed losses must be
    the unbroken ones (``resumed_loss_difference``; exact on cpu), so the weights, the optimizer
    state and the data position came back, not only the step."""
    cuda = ctx.ranks.cuda
    budget = ctx.share(0.2, 60 if cuda else 25)
    first_s = None
    if ctx.checkpointed is not None:
        plan, out, done, flags = ctx.checkpointed
    else:
        workload = workloads.dlrm(ctx.ranks, table_bytes=1e9 if cuda else 20e6, name="dlrm_small")
        plan, out, done, flags = _plan(ctx, workload, budget / 4), ctx.work / "resume", 80 if cuda else 12, [
            "--warmup", "2"]
        first_s = ctx.run(["train", "--plan", str(plan), "--out", str(out), "--iterations", str(done), *flags,
                           "--checkpoint-every", str(done // 2), "--no-track"], budget / 3).seconds
    checkpoint_bytes = sum(f.stat().st_size for f in (out / "checkpoints").rglob("*") if f.is_file())
    more = done + done // 2
    second = ctx.run(["train", "--plan", str(plan), "--out", str(out), "--iterations", str(more), *flags,
                      "--checkpoint-every", str(done // 2), "--resume", "--no-track"], max(20.0, ctx.left() * 0.3))
    metrics = read_json(out / "train_metrics.json")
    if metrics.get("resumed_from") != done:
        raise SectionFailed(f"resumed from iteration {metrics.get('resumed_from')}, not from the checkpoint of "
                            f"iteration {done}")
    unbroken = ctx.work / "resume_unbroken"
    ctx.run(["train", "--plan", str(plan), "--out", str(unbroken), "--iterations", str(more), *flags, "--no-track"],
            max(20.0, ctx.left() * 0.3))
    resumed_losses, unbroken_losses = (_losses(d, done) for d in (out, unbroken))
    difference = float(np.max(np.abs(resumed_losses - unbroken_losses) / np.maximum(np.abs(unbroken_losses), 1e-12)))
    figures = {"plan": plan.name, "checkpoint_bytes": checkpoint_bytes, "resumed_from": metrics["resumed_from"],
               "iterations": metrics["iterations"], "checkpointed_command_s": first_s,
               "resume_command_s": round(second.seconds, 1),
               "p50_ms_after_resume": metrics["iteration_latency_ms"]["p50"],
               "resumed_losses": resumed_losses.tolist(), "unbroken_losses": unbroken_losses.tolist(),
               "resumed_loss_difference": difference}
    return Outcome(figures, f"resumed at iteration {done} from a {checkpoint_bytes / 1e6:.0f} MB checkpoint, trained "
                            f"on to {more}: losses {difference:.2g} (relative) from an unbroken run's",
                   (target("resumed_loss_difference", difference, cuda),))


def _losses(out: Path, start: int) -> np.ndarray:
    """The loss of every iteration from ``start`` on, from the training's iterations.parquet."""
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "iterations.parquet", columns=["iteration", "loss"]).to_pydict()
    losses: np.ndarray = np.array([loss for i, loss in zip(rows["iteration"], rows["loss"], strict=True) if i >= start])
    return losses


def measure(ctx: Context) -> Outcome:
    """``shardflow measure`` on the trained plan: predicted against measured."""
    budget = ctx.share(0.2, 45 if ctx.ranks.cuda else 25)
    plan = ctx.train_plan or _plan(ctx, workloads.dlrm(ctx.ranks), budget / 3)
    out = ctx.work / "measure"
    # Blocks long enough for a spread that means something: the DLRM's embeddings take 1-2 ms an
    # iteration on one GPU, and runs d and e timed 8 a block, where one host hiccup moved a block 10-28%.
    sized = (["--iterations", "400", "--warmup", "20", "--blocks", "5"] if ctx.ranks.cuda
             else ["--iterations", "4", "--warmup", "1"])
    ctx.run(["measure", "--plan", str(plan), "--out", str(out), "--no-track", *sized], budget)
    m = read_json(out / "measure.json")
    spread = m.get("spread")
    return Outcome({k: m.get(k) for k in ("plan_id", "critical_path_predicted", "critical_path_measured", "error",
                                          "spread", "blocks", "iterations", "warmup")},
                   f"predicted {m['critical_path_predicted']:.3f} ms (TorchRec's defaults), measured "
                   f"{m['critical_path_measured']:.3f} ms (spread {spread or 0:.1%})",
                   (target("measure_spread", spread, ctx.ranks.cuda),))


def calibrate(ctx: Context) -> Outcome:
    """The full calibration on these ranks (cpu: the quick probe set, to keep the check short there);
    where its time goes per probe."""
    from rec.train.timings import read_timings

    cuda = ctx.ranks.cuda
    budget = ctx.share(0.6, 180 if cuda else 60)
    topology = ctx.topology_file("calibrate", 512)
    profile = ctx.out / "profile.yaml"
    work = ctx.work / "calibrate"
    args = ["calibrate", "--topology", str(topology), "--out", str(profile), "--work", str(work)]
    if not cuda:
        args += ["--quick", "--iterations", "2", "--warmup", "1"]
    finished = ctx.run(args, budget)
    fit = read_json(profile.with_name("profile.fit.json"))
    timings = read_timings(work)
    phases = [p.phases for p in timings.plans]
    overhead = float(np.mean([p.overhead_s for p in phases]))
    ctx.profile, ctx.overhead_s = profile, max(0.05, overhead)
    totals = {f"{k}_s": round(float(sum(getattr(p, f"{k}_s") for p in phases)), 2)
              for k in ("setup", "warmup", "timed", "teardown")}
    launch = finished.seconds - sum(totals.values())
    figures = {"quick": not cuda, "probes": len(fit["probes"]), "command_s": round(finished.seconds, 1),

               "median_abs_residual": fit["median_abs_residual"], "max_abs_residual": fit["max_abs_residual"],
               "left_out": fit["left_out"], "overhead_per_probe_s": round(overhead, 3),
               "launch_and_fit_s": round(launch, 1), **totals}
    return Outcome(figures, f"{figures['probes']} probes in {finished.seconds:.0f} s ({overhead:.2f} s overhead "
                            f"per probe); median |residual| {fit['median_abs_residual']:.1%}",
                   (target("calibrate_seconds", finished.seconds, cuda),))
