"""Where a calibration's time goes, before and after issue 24, side by side on this machine.

Runs `shardflow calibrate` from two source trees — a commit before (default 2ea6d61: every probe's
model rebuilt for each of its 3 rounds, a full garbage collection after each, ids drawn on the host,
the tables initialized twice) and this checkout — alternating, `--repeats` times each, on the same
topology and probe set. Per run: probe runs (probes x rounds before, probes after: a probe's rounds
are blocks of one build now), the measure step's wall time (the launch included), the timed
iterations' own time (the slowest rank's, from timings.json), and the overhead per probe run: wall
minus timed, over the runs. Prints both and their ratio; writes bench/results/calibration_overhead.json.

    .venv/bin/python bench/calibration_overhead.py                   # full calibration, ~6 min on 2 cores
    .venv/bin/python bench/calibration_overhead.py --quick --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STEP_TIME = re.compile(r"measure ([0-9.]+) s")


def export(commit: str, into: Path) -> Path:
    """The tree of ``commit`` (no .git) in ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def calibrate(tree: Path, topology: str, work: Path, quick: bool) -> dict:
    profile = work / "profile.yaml"
    args = [sys.executable, "-m", "flows.cli", "calibrate", "--topology", topology, "--out", str(profile),
            "--work", str(work / "probes")]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    r = subprocess.run([*args, *(["--quick"] if quick else [])], cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if r.returncode != 0:
        raise RuntimeError(f"calibrate in {tree} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    step = STEP_TIME.search(r.stdout)
    timings = json.loads((work / "probes" / "timings.json").read_text())
    timed_s = 0.0
    for plan in timings["plans"]:
        total = np.asarray(plan["fwd_ms"]) + np.asarray(plan["bwd_ms"])
        timed_s += float(total.sum(axis=1).max()) / 1e3 if total.size else 0.0
    warmup_iterations = sum(p.get("phases", {}).get("warmup_iterations", p["warmup"]) for p in timings["plans"])
    runs = len(timings["plans"])
    measure_s = float(step.group(1)) if step else seconds
    fit = json.loads(profile.with_name("profile.fit.json").read_text())
    return {"seconds": round(seconds, 1), "measure_step_s": measure_s, "probe_runs": runs,
            "probes": len(fit["probes"]), "timed_s": round(timed_s, 2), "warmup_iterations": warmup_iterations,
            "overhead_per_run_s": (measure_s - timed_s) / runs,
            "overhead_per_probe_s": (measure_s - timed_s) / len(fit["probes"]),
            "median_abs_residual": fit["median_abs_residual"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default="2ea6d61", help="the commit before (default: 2ea6d61)")
    p.add_argument("--after", default=None,
                   help="a commit or a source tree to compare with it (default: this checkout)")
    p.add_argument("--topology", default=str(ROOT / "examples/topologies/cpu_2proc.yaml"))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="the quick probe set (one round)")
    p.add_argument("--out", default=str(ROOT / "bench/results/calibration_overhead.json"))
    args = p.parse_args()
    results: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="calibration-overhead-") as tmp:
        before = export(args.before, Path(tmp, "before"))
        after = ROOT
        if args.after:
            after = Path(args.after) if Path(args.after).is_dir() else export(args.after, Path(tmp, "after"))
        trees = {"before": before, "after": after}
        for repeat in range(args.repeats):
            for label in ("before", "after") if repeat % 2 == 0 else ("after", "before"):
                work = Path(tmp, f"{label}-{repeat}")
                work.mkdir()
                run = calibrate(trees[label], args.topology, work, args.quick)
                results[label].append(run)
                print(f"{label:6s} repeat {repeat + 1}: {run}", flush=True)
    summary = {label: {k: float(np.median([r[k] for r in runs]))
                       for k in ("seconds", "measure_step_s", "probe_runs", "timed_s", "overhead_per_run_s",
                                 "overhead_per_probe_s", "median_abs_residual")}
               for label, runs in results.items()}
    b, a = summary["before"], summary["after"]
    print(f"\n{'':28s} {'before':>10s} {'after':>10s} {'after/before':>12s}")
    for key in ("seconds", "measure_step_s", "probe_runs", "timed_s", "overhead_per_run_s", "overhead_per_probe_s",
                "median_abs_residual"):
        print(f"{key:28s} {b[key]:10.3f} {a[key]:10.3f} {a[key] / b[key] if b[key] else float('nan'):12.2f}")
    Path(args.out).write_text(json.dumps({"before_commit": args.before, "after_commit": args.after,
                                          "quick": args.quick, "repeats": args.repeats,
                                          "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0],
                                          "runs": results, "summary": summary}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
