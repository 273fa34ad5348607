"""``shardflow measure --plan DIR/plan.json``: time the plan's sharded embedding modules on its ranks
and compare with what the plan predicts.

The spec's embedding modules alone (no dense layers), sharded by DistributedModelParallel with
exactly the plan (fused row-wise Adagrad), run under torchrun (gloo on cpu, NCCL and CUDA events on
cuda) on synthetic ids at the plan's batch size and each table's pooling factor: a warm-up, then
timed iterations (forward with input and output distribution, backward with the optimizer), every
iteration started together on all ranks. Writes OUT/measure.json: per rank the predicted time
(the plan's cost model and profile) and the measured median and 90th percentile, the critical path
of both and the error (docs/measure.md). Checked first as for `train`: a problem exits 2 in
seconds. Recorded in MLflow as a measure run (node 0; `--no-track` for the file only).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rec.exit_codes import ExitCode
from rec.settings import add_flags

if TYPE_CHECKING:
    from rec.analysis.iteration_time import Prediction
    from rec.train.measure_report import MeasureReport

MAX_RANK_ROWS = 32  # ranks shown one by one; beyond, the critical rank and a summary


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from rec.train.measure_config import MeasureConfig
    from tasks.measure import Ranks
    from tasks.tracking import TrackingSettings

    p = subparsers.add_parser("measure", help="time a plan on its ranks against its prediction (measure.json)",
                              description=__doc__)
    p.add_argument("--plan", required=True, metavar="PLAN", help="plan.json or its directory")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="measure.json and logs/ go here, DIR locked for the run "
                        "(default: a new out/<plan_id>/measure-<time>, out/latest the newest)")
    add_flags(p.add_argument_group("measuring job"), MeasureConfig)
    add_flags(p.add_argument_group("processes"), Ranks)
    add_flags(p.add_argument_group("tracking"), TrackingSettings)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from flows.commands.launch_faults import launch_faults
    from flows.commands.train import render_logged
    from flows.progress import on_terminal
    from rec.plan import read_plan
    from rec.settings import check, from_flags
    from tasks.measure import MEASURE_KIND, MeasureFailed, MeasureSettings, measure
    from tasks.recorder import Logged
    from tasks.run_dirs import RunDirs
    from tasks.tracking import TrackingSettings

    started = time.perf_counter()
    settings = from_flags(MeasureSettings, args)
    check(settings, "Cannot measure with these settings:")
    tracking = from_flags(TrackingSettings, args)
    resolved = tracking.resolve()  # what the environment gives MLflow in the flags' place: checked before the work
    dirs = RunDirs.of(args.out)
    logged: Logged | None = None
    with launch_faults("shardflow measure", lambda: args.out or ".") as fault, \
            on_terminal() as shown, dirs.locked(settings.ranks.node_rank):
        plan_id = read_plan(args.plan).plan_id
        out = dirs.train_dir(plan_id, nested=False, kind=MEASURE_KIND)
        try:
            measured = measure(args.plan, out, settings)
        except MeasureFailed as e:
            print(f"shardflow measure: the measurement failed: {e.cause}\n  logs: {e.logs}", file=sys.stderr)
            return ExitCode.of_failure(e.deterministic)
        dirs.mark_latest(out)
        if tracking.track and measured.report is not None:
            from tasks.measure_record import record_measure

            logged = record_measure(resolved, measured)
    if fault.code is not None:
        return fault.code
    if measured.report is None:
        print(f"measure   done on node {settings.ranks.node_rank}; node 0 writes measure.json")
    else:
        from rec.analysis.iteration_time import prediction

        print(render_report(measured.report, prediction(read_plan(args.plan))))
        print(f"wrote     {measured.out_dir}/measure.json (logs in {measured.out_dir}/logs)")
    if logged is not None:
        print(render_logged(logged, tracking, "measure run"))
    print(f"time      {shown.summary(time.perf_counter() - started)}")
    return ExitCode.OK


def render_report(report: MeasureReport, predicted: Prediction) -> str:
    """Per rank predicted against measured, then the plan's predicted iteration time (as ``plan``
    prints it) beside the measured one, and their ratio."""
    from flows.reports import typed
    from rec.analysis.iteration_time import UNCALIBRATED_NOTE, ms, ratio_text
    from rec.text_table import render_table

    critical = max(range(report.world_size), key=lambda r: report.measured_ms[r])
    ranks = list(range(report.world_size))
    if len(ranks) > MAX_RANK_ROWS:
        ranks = sorted({*ranks[:4], critical, ranks[-1]})
    rows = [[r, f"{report.predicted_ms[r]:.3f}", f"{report.measured_ms[r]:.3f}", f"{report.measured_p90_ms[r]:.3f}",
             f"{report.measured_fwd_ms[r]:.3f}", f"{report.measured_bwd_ms[r]:.3f}",
             "<- critical path" if r == critical else ""] for r in ranks]
    header = ["rank", "predicted_ms", "measured_ms", "p90_ms", "fwd_ms", "bwd_ms", ""]
    table = render_table(header, rows, right=header[:-1])
    profile = report.profile["name"] or ("TorchRec's defaults" if report.profile["default"] else "unnamed")
    shown = "" if len(ranks) == report.world_size else f" ({len(ranks)} of {report.world_size} ranks shown)"
    measured = report.critical_path_measured
    return "\n".join([
        table + shown,
        "",
        f"predicted      {predicted.text()}",
        f"measured       {ms(measured)} per iteration (rank {critical}'s median of {report.blocks} blocks, "
        f"{report.iterations} iterations after {report.warmup} warm-up; spread {report.spread:.1%}): "
        f"{ratio_text(measured, predicted.iteration_ms)}",
        f"profile        {profile} (hash {report.profile['hash']}); measured on {report.machine.get('device_name')}, "
        f"{report.world_size} ranks",
        *([f"note           {typed(UNCALIBRATED_NOTE)}"] if report.profile["default"] else []),
    ])
