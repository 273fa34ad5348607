"""``shardflow calibrate --topology TOPO --out profile.yaml``: measure this machine's ranks and fit a
hardware profile to them (docs/profile.md, "Calibration").

Plans a designed set of small probe plans for the topology's ranks (per sharding type and kernel
the device runs: tables per rank, dims, pooling factors, batch sizes and rows varied one at a time,
and mixes of sharding types), measures them all in one torchrun launch of the measuring job (as
`shardflow measure` does), each in three rounds in different orders, and fits the profile by
non-negative least squares on the cost model's own formulas. Writes the profile (with the machine
it was measured on) and, beside it, PROFILE.fit.json: each probe's measured and predicted time and
residual. Prints the probes predicted against measured and the fit's error (docs/profile.md says
how long it takes); `--quick` measures about half the probes, once. Plan with the result:
`shardflow plan SPEC --topology TOPO --profile profile.yaml`. A fit the measurements cannot give
(e.g. every probe timed out) exits 2 and writes no profile.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rec.exit_codes import ExitCode
from rec.settings import add_flags

if TYPE_CHECKING:
    from tasks.calibrate import Calibrated

MAX_PROBE_ROWS = 60
MAX_POOR_NAMES = 4  # the summary names the worst determined numbers; the fit report has them all


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tasks.calibrate import CalibrateSettings
    from tasks.measure import Ranks

    p = subparsers.add_parser("calibrate", help="measure this machine's ranks and fit a hardware profile",
                              description=__doc__)
    p.add_argument("--topology", metavar="TOPO", required=True, help="topology YAML: the ranks to measure")
    p.add_argument("--out", metavar="PROFILE", required=True, help="the profile YAML to write (and PROFILE.fit.json)")
    p.add_argument("--work", metavar="DIR", default=None,
                   help="the probe plans, timings.json and logs/ (default: a new out/calibrate/calibrate-<time>)")
    add_flags(p.add_argument_group("calibration"), CalibrateSettings, skip=("ranks",))
    p.add_argument("--max-probes", type=int, default=None, help=argparse.SUPPRESS)  # testing only
    add_flags(p.add_argument_group("processes"), Ranks)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from flows.commands.launch_faults import launch_faults
    from flows.progress import on_terminal
    from rec.settings import from_flags
    from tasks.calibrate import CalibrateSettings, calibrate, checked_inputs
    from tasks.measure import MeasureFailed
    from tasks.run_dirs import RunDirs

    started = time.perf_counter()
    settings = from_flags(CalibrateSettings, args, max_probes=args.max_probes)
    checked_inputs(args.topology, args.out, settings)  # every problem at once, before the work folder is made
    dirs = RunDirs.of(args.work)
    with launch_faults("shardflow calibrate", lambda: args.out, lambda: "; no profile was written") as fault, \
            on_terminal() as shown, dirs.locked(settings.ranks.node_rank):
        work = dirs.train_dir("calibrate", nested=False, kind="calibrate")
        try:
            calibrated = calibrate(args.topology, args.out, work, settings)
        except MeasureFailed as e:
            print(f"shardflow calibrate: the measurement failed: {e.cause}\n  logs: {e.logs}\n"
                  f"  no profile was written", file=sys.stderr)
            return ExitCode.of_failure(e.deterministic)
    if fault.code is not None:
        return fault.code
    print(render_calibrated(calibrated))
    print(f"time      {shown.summary(time.perf_counter() - started)}")
    return ExitCode.OK


def render_calibrated(c: Calibrated) -> str:
    from rec.calibrate.fit import POOR_RELATIVE_ERROR
    from rec.profile import describe_profile
    from rec.text_table import render_table

    if c.fit is None:
        return f"calibrate done on this node; node 0 fits and writes the profile (work in {c.work_dir})"
    fit = c.fit
    rows = [[p.name, f"{p.measured_ms:.3f}", f"{p.predicted_ms:.3f}", f"{p.error:+.1%}"] for p in fit.probes]
    if len(rows) > MAX_PROBE_ROWS:
        worst = sorted(range(len(rows)), key=lambda i: -abs(fit.probes[i].error))[:MAX_PROBE_ROWS]
        rows = [rows[i] for i in sorted(worst)]
    header = ["probe", "measured_ms", "predicted_ms", "residual"]
    lines = [render_table(header, rows, right=header[1:]), ""]
    lines.append(f"fit       {len(fit.probes)} probes: median |residual| {fit.median_abs_error:.1%}, "
                 f"max {fit.max_abs_error:.1%}" + (f"; timed out: {', '.join(c.timed_out)}" if c.timed_out else ""))
    if poor := fit.poorly_determined:
        more = f" and {len(poor) - MAX_POOR_NAMES} more ({c.fit_path})" if len(poor) > MAX_POOR_NAMES else ""
        lines.append(f"poorly determined (standard error over {POOR_RELATIVE_ERROR:.0%}): "
                     f"{', '.join(poor[:MAX_POOR_NAMES])}{more}")
    lines.append(f"profile   {describe_profile(fit.profile)}")
    lines.append(f"wrote     {c.profile_path}, {c.fit_path} (probes, timings and logs in {c.work_dir})")
    return "\n".join(lines)
