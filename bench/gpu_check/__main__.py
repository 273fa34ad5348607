"""Check shardflow's cuda path on this machine: every visible GPU a rank, each step a user runs.

    PYTHONPATH=. python -m bench.gpu_check --out DIR [--minutes 8] [--device cuda|cpu] [--sections ...]
        [--specs FILE ... [--also-builtin]] [--profile FILE]

From a plain checkout: nothing installed but torch, torchrec and fbgemm-gpu (and numpy, scipy,
pyarrow, pyyaml, highspy); Prefect, Ray and MLflow may be absent (tracking is off). The sections
(docs/gpu.md): ``train`` (a GPU-sized DLRM, both pipelines), ``data`` (the DLRM fed from Parquet
against synthetic batches), ``resume``, ``measure``, ``calibrate``
(the full calibration), ``calibration`` (predicted against measured on GPU-sized workloads),
``vs_torchrec`` (TorchRec's planners' plans against shardflow's, measured). Each gets a share of
``--minutes``; one that cannot fit is skipped with the reason. Each section has targets
(``bench.gpu_check.targets``); a section that misses one fails, naming it. ``--specs FILE...``: the
calibration and TorchRec comparison run your workloads (spec files of any format; YAML or JSON
with ``tables:`` may set ``batch_size`` and ``hbm_cap`` per rank) instead of the check's own (beside
them with ``--also-builtin``), and fail where one of them was not measured; ``--profile FILE``: the
calibration section judges that profile (run without the calibrate section, which would replace it).
Writes DIR/gpu_check.json, DIR/gpu_check.md and DIR/commands.log (every command's output); exits 0
exactly when every section it ran is ok and every target met, 1 otherwise (a skipped section
included), 2 for bad arguments or a python without the GPU stack (``STACK``; ``make gpu-check
GPU_PYTHON=...`` chooses another).
``--device cpu`` runs the same sections on 2 gloo ranks with small sizes and loose bounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

# What every section imports (module names); checked before anything imports them.
STACK = ("torch", "torchrec", "fbgemm_gpu", "numpy", "scipy", "pyarrow", "yaml", "highspy")
BAD_INPUT = 2  # rec.exit_codes.ExitCode.BAD_INPUT, which this python may not be able to import


def missing_stack() -> str | None:
    """One line naming this python and what of ``STACK`` it lacks, and how to choose another; None if it has it all."""
    missing = [name for name in STACK if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"gpu_check: {sys.executable} (Python {platform.python_version()}) has no {', '.join(missing)}: "
            "run it with a python that has the GPU stack, e.g. make gpu-check GPU_PYTHON=/path/to/venv/bin/python "
            "(docs/gpu.md)")


if __name__ == "__main__" and (_missing := missing_stack()):
    print(_missing, file=sys.stderr)
    sys.exit(BAD_INPUT)

from bench.gpu_check import compare, sections  # noqa: E402
from bench.gpu_check.context import Context, Outcome, SectionFailed, Skipped  # noqa: E402
from bench.gpu_check.machine import TimedOut, find_ranks, pick_device, versions  # noqa: E402
from bench.gpu_check.report import Report, Section, Status, write_report  # noqa: E402
from bench.gpu_check.targets import target  # noqa: E402
from bench.gpu_check.workloads import DEFAULT_BATCH, Ranks, Workload, read_workloads  # noqa: E402
from rec.errors import InputError  # noqa: E402
from rec.exit_codes import ExitCode, stopped_by  # noqa: E402
from rec.library_noise import quiet_unlisted_fbgemm  # noqa: E402
from rec.sharding import ComputeDevice  # noqa: E402
from rec.stop_signals import Stopped, raise_stopped  # noqa: E402

GIVEN_SECTIONS = ("calibration", "vs_torchrec")  # the sections that run --specs workloads
SECTIONS: dict[str, Callable[[Context], Outcome]] = {
    "train": sections.train, "data": sections.data, "resume": sections.resume, "measure": sections.measure,
    "calibrate": sections.calibrate, "calibration": compare.calibration, "vs_torchrec": compare.vs_torchrec,
}
DEFAULT_MINUTES = {ComputeDevice.CUDA: 8.0, ComputeDevice.CPU: 6.0}
MAX_MINUTES = 600.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR", help="the report and every command's files go here")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda: every visible GPU a rank; cpu: 2 gloo ranks, small sizes; auto: cuda if a GPU is "
                        "visible (default)")
    p.add_argument("--minutes", type=float, default=None,
                   help=f"the whole check's budget (default {DEFAULT_MINUTES[ComputeDevice.CUDA]:g} on cuda, "
                        f"{DEFAULT_MINUTES[ComputeDevice.CPU]:g} on cpu)")
    p.add_argument("--sections", nargs="+", default=[",".join(SECTIONS)], metavar="SECTION",
                   help=f"comma- or space-separated, run in this order (default: all: {','.join(SECTIONS)})")
    p.add_argument("--specs", nargs="+", default=[], metavar="FILE",
                   help="your workloads for the calibration and TorchRec comparison: spec files (any format of "
                        "docs/spec.md; a YAML/JSON mapping with tables: may set batch_size and hbm_cap per rank), "
                        "each named by its file's stem")
    p.add_argument("--also-builtin", action="store_true",
                   help="with --specs: the check's own workloads too, reported apart")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="the profile the calibration section judges (leave the calibrate section out)")
    args = p.parse_args(argv)
    wanted = [s.strip() for given in args.sections for s in given.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown or not wanted:
        p.error(f"--sections: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(SECTIONS)}")
    twice = sorted({s for s in wanted if wanted.count(s) > 1})
    if twice:
        p.error(f"--sections: {', '.join(twice)} given twice; each section runs once")
    if not args.out.strip():
        p.error("--out: an empty path (an unset shell variable?): name the folder for the report")
    if args.minutes is not None and not 0 < args.minutes <= MAX_MINUTES:
        p.error(f"--minutes must be above 0 and at most {MAX_MINUTES:g}")
    if args.specs and not set(wanted) & set(GIVEN_SECTIONS):  # nothing would measure them, and it could pass
        p.error(f"--specs: only {' and '.join(GIVEN_SECTIONS)} run your workloads, and --sections leaves both out")
    if args.also_builtin and not args.specs:
        p.error("--also-builtin: runs the check's own workloads beside yours (--specs); without them they run anyway")
    args.sections = wanted
    return args


def main(argv: list[str] | None = None) -> int:
    quiet_unlisted_fbgemm()
    args = parse(argv)
    started = time.monotonic()
    out = Path(args.out).resolve()
    # The first folder of --out's path this run makes: removed again where the check does not start,
    # with the folders made inside it (no empty report folder, no empty folders on its way).
    created = next((p for p in reversed([out, *out.parents]) if not p.exists()), None)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".gpu_check-writable"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        print(f"gpu_check: --out {args.out}: cannot write there ({e.strerror or e})", file=sys.stderr)
        return ExitCode.BAD_INPUT
    # SIGTERM raises where the check is, as Ctrl-C does: the command running then is stopped with its
    # processes (machine.shardflow) and the report kept; while it starts, nothing is left.
    signal.signal(signal.SIGTERM, raise_stopped)
    try:
        cache_bytecode(out / "pycache")
        device = pick_device(args.device)
        try:
            ranks = find_ranks(device)
        except ValueError as e:
            print(f"gpu_check: {e}", file=sys.stderr)
            _remove_if(created)
            return ExitCode.BAD_INPUT
        bad: list[str] = []  # every bad input file at once: --specs and --profile
        given: list[Workload] = []
        profile = None
        try:
            given = read_workloads(args.specs, ranks, compare.builtin_names(ranks) if args.also_builtin else ())
        except InputError as e:
            bad.append(e.render())
        except ValueError as e:
            bad.append(str(e))
        try:
            profile = _profile(args.profile, ranks)
        except InputError as e:
            bad.append(e.render())
        except ValueError as e:
            bad.append(str(e))
        if args.profile is not None and "calibrate" in args.sections:
            bad.append("--profile: the calibrate section fits a profile of its own, which the calibration section "
                       "would judge instead: leave calibrate out of --sections, or --profile out")
        if bad:
            print("gpu_check: " + "\n".join(bad), file=sys.stderr)
            _remove_if(created)
            return ExitCode.BAD_INPUT
        minutes = args.minutes or DEFAULT_MINUTES[device]
        ctx = Context(ranks, out, started + minutes * 60, out / "commands.log", profile=profile, given=tuple(given),
                      builtin=not given or args.also_builtin)
        report = Report(device.value, ranks.world_size, minutes, versions(device),
                        started_at=datetime.now(UTC).replace(microsecond=0).isoformat())
        print(f"gpu_check: {ranks.world_size} {device.value} rank(s) ({report.versions.get('gpu') or 'cpu'}), "
              f"{len(args.sections)} sections in {minutes:g} minutes; files in {out}", flush=True)
    except KeyboardInterrupt as e:  # before any section ran: no report to keep
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        _remove_if(created)
        print(f"gpu_check: stopped by {signal.Signals(signum).name} while starting; nothing was run",
              file=sys.stderr)
        return stopped_by(signum)
    for name in args.sections:
        try:
            report.sections.append(run_section(name, ctx))
        except KeyboardInterrupt as e:  # Ctrl-C or Stopped: the running command and its processes are stopped by now
            signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
            how = f"stopped by {signal.Signals(signum).name}"
            at = args.sections.index(name)
            report.sections.append(Section(name, Status.FAILED, reason=f"{how} before it finished"))
            report.sections += [Section(n, Status.SKIPPED, reason=f"not run: the check was {how} in the {name} "
                                                                 "section") for n in args.sections[at + 1:]]
            report.seconds = time.monotonic() - started
            write_report(out, report)
            print(f"gpu_check: {how} in the {name} section; the {at} sections before it are in "
                  f"{out / 'gpu_check.md'}", file=sys.stderr)
            return stopped_by(signum)
        report.seconds = time.monotonic() - started
        write_report(out, report)  # after every section: a stopped check keeps what it found
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ok = [s for s in report.sections if s.status is Status.OK]
    missed = [f"{s.name}: {s.reason}" for s in report.sections if s.status is not Status.OK]
    print(f"gpu_check: {len(ok)} of {len(report.sections)} sections ok in {report.seconds:.0f} s: "
          f"{'passed' if report.passed else 'not passed'}; report: {out / 'gpu_check.md'}", flush=True)
    for line in missed:
        print(f"gpu_check: not passed: {line}", flush=True)
    return ExitCode.OK if report.passed else ExitCode.FAILED


def _remove_if(created: Path | None) -> None:
    """The folders of --out this run made (``created``: the first; with the bytecode written in --out),
    where the check never started."""
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)


def _profile(path: str | None, ranks: Ranks) -> Path | None:
    """``--profile``, read once here so that a bad file, or one for another kind of device than
    ``ranks``, is named before any section runs."""
    if path is None:
        return None
    from rec.profile import read_profile
    from rec.profile.validate import check_profile_for
    from rec.topology import topology_from_dict

    check_profile_for(read_profile(path), topology_from_dict(ranks.topology(DEFAULT_BATCH[ranks.cuda])),
                      f"--profile {path}")
    return Path(path).resolve()


HEAVY_PACKAGES = ("torch", "torchrec", "fbgemm_gpu")  # what every rank imports: seconds of bytecode each


def cache_bytecode(prefix: Path) -> None:
    """Where the installed torch, torchrec or fbgemm-gpu have no bytecode beside their sources, the
    bytecode of every module this check and its processes import goes to ``prefix``, written once
    and read by every later process. GPU images often install them without bytecode and set
    PYTHONDONTWRITEBYTECODE: then every rank recompiles them from source (``import torchrec`` 19 s
    instead of 8 s on this project's cpu machine), each launch. Where the bytecode is there (a
    ``make install`` venv), a prefix would hide it and have the first process compile it all again."""
    if all(_has_bytecode(name) for name in HEAVY_PACKAGES):
        return
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = str(prefix)
    sys.dont_write_bytecode = False


def _has_bytecode(package: str) -> bool:
    """The package's ``__init__`` has current bytecode next to it (False where it is not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return False
    cached = Path(importlib.util.cache_from_source(spec.origin))
    return cached.is_file() and cached.stat().st_mtime >= Path(spec.origin).stat().st_mtime


def run_section(name: str, ctx: Context) -> Section:
    """One section, its failure or skip turned into its status and reason (one line)."""
    section = Section(name)
    began = time.monotonic()
    print(f"gpu_check: {name} ...", flush=True)
    try:
        outcome = SECTIONS[name](ctx)
        section.figures, section.summary, section.targets = outcome.figures, outcome.summary, list(outcome.targets)
        missed = [t.line() for t in outcome.targets if not t.met]
        section.status = Status.FAILED if missed else Status.OK
        if missed:
            section.reason = f"missed {'; '.join(missed)} ({outcome.summary})"
    except Skipped as e:
        section.status, section.reason = Status.SKIPPED, str(e)
        if name in GIVEN_SECTIONS and ctx.given:  # each of your workloads named, as one the budget did not reach
            section.figures = {"given_not_measured": {w.name: f"the section was skipped: {e}" for w in ctx.given}}
            section.targets = [target("given_not_measured", float(len(ctx.given)), ctx.ranks.cuda)]
    except (SectionFailed, TimedOut) as e:
        section.status, section.reason = Status.FAILED, str(e)
    except Exception as e:  # a bug in a section fails that section, the others still run
        section.status, section.reason = Status.FAILED, f"{type(e).__name__}: {e}"[:600]
        with ctx.log.open("a") as log:
            log.write(f"\n{name} failed:\n{traceback.format_exc()}\n")
    section.seconds = time.monotonic() - began
    section.reason = compare.one_line(section.reason) if section.reason else section.reason  # a table cell
    print(f"gpu_check: {name} {section.status.value} in {section.seconds:.0f} s: "
          f"{section.summary if section.status is Status.OK else section.reason}", flush=True)
    return section


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before or after the sections: nothing of the check's own is running
        print("gpu_check: stopped by SIGINT", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
