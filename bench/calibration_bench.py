"""Predicted against measured, with TorchRec's default profile and with a calibrated one.

On this machine (cpu, 2 gloo ranks): `shardflow calibrate` once, then specs of different shapes
(tables 5-200, dims 8-256, pooling factors 1-50, rows 1e3-1e7, batch 128-4096; a few with
column-wise allow-lists so the plans mix sharding types), each planned twice (under the default
profile and under the calibrated one). Every plan is measured `--repeats` times by the measuring
job of `shardflow measure` (`tasks.measure.run_measuring_job`; a plan's numbers are measure.json's,
`rec.train.measure_report`), all plans in one launch per repeat, in another order each time: a
burst of load hits one measurement of a plan, not all, and one launch per repeat keeps the whole
benchmark short (about 15 minutes), so the load stays what it was during the calibration. A plan's
measured time is the median of its repeats. Per plan: the critical path predicted by
each profile (the same placement re-rated, `rec.analysis.rank_times`) and measured, and each model's
error; over the plans the median absolute error and the Spearman rank correlation; per spec the
plan chosen under each profile, both measured, with the spread of the repeats as the noise.

    .venv/bin/python bench/calibration_bench.py                      # ~15 min on 2 cores
    .venv/bin/python bench/calibration_bench.py --profile P.yaml     # skip calibrating
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARDFLOW = Path(sys.executable).parent / "shardflow"
sys.path.insert(0, str(ROOT))

MEMORY_BYTES = 4e9  # all tables of a spec: 2 ranks hold it (replicas twice) well under ~12 GB
# (seed, tables, batch per rank, share of tables allow-listed column_wise/table_column_wise)
SPECS = ((1, 5, 512, 0.0), (2, 12, 128, 0.0), (3, 30, 1024, 0.0), (4, 60, 256, 0.2), (5, 100, 512, 0.0),
         (6, 200, 128, 0.0), (7, 8, 4096, 0.0), (8, 20, 2048, 0.25), (9, 45, 512, 0.0), (10, 150, 256, 0.1),
         (11, 16, 1024, 0.0), (12, 80, 2048, 0.0))


def spec_rows(seed: int, tables: int, column_share: float) -> list[dict]:
    """Random tables in the issue's ranges, their weights under ``MEMORY_BYTES`` together, each under 1.5 GB."""
    from rec.spec.synthetic import random_table_rows

    return random_table_rows(seed, tables, column_share, MEMORY_BYTES, max_table_bytes=1.5e9)


def shardflow(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([str(SHARDFLOW), *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"shardflow {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def load() -> dict:
    one, five, fifteen = os.getloadavg()
    return {"load_1m": round(one, 2), "load_5m": round(five, 2), "load_15m": round(fifteen, 2),
            "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b)[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default=str(ROOT / "examples/topologies/cpu_2proc.yaml"))
    p.add_argument("--profile", default=None, help="a calibrated profile to use instead of calibrating")
    p.add_argument("--repeats", type=int, default=3, help="measurements per plan, round-robin")
    p.add_argument("--iterations", type=int, default=20, help="timed iterations per plan and repeat")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--specs", type=int, default=len(SPECS), help="the first N specs")
    p.add_argument("--work", default=None, help="keep plans and measurements here (default: a temporary dir)")
    p.add_argument("--out", default=str(ROOT / "bench/results/calibration_bench.json"))
    args = p.parse_args()

    from rec.analysis.rank_times import predicted_ms
    from rec.plan import read_plan
    from rec.profile import DEFAULT_PROFILE, read_profile
    from rec.spec import spec_from_rows, write_spec
    from rec.topology import read_topology, topology_to_dict
    from rec.train.measure_config import MeasureConfig
    from rec.train.measure_report import measure_report
    from tasks.measure import Ranks, run_measuring_job

    began = time.perf_counter()
    loads = [load()]
    print(f"load before: {loads[0]}", flush=True)
    with tempfile.TemporaryDirectory(prefix="calibration-bench-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        calibration: dict = {}
        profile_path = args.profile
        if profile_path is None:
            profile_path = str(work / "profile.yaml")
            started = time.perf_counter()
            shardflow("calibrate", "--topology", args.topology, "--out", profile_path,
                      "--work", str(work / "calibrate"))
            fit = json.loads(Path(profile_path).with_name("profile.fit.json").read_text())
            calibration = {"seconds": round(time.perf_counter() - started, 1), "probes": len(fit["probes"]),
                           "median_abs_residual": fit["median_abs_residual"],
                           "max_abs_residual": fit["max_abs_residual"]}
            print(f"calibrated in {calibration['seconds']} s: {calibration}", flush=True)
            loads.append(load())
        calibrated = read_profile(profile_path)

        plans: list[dict] = []
        for seed, tables, batch, share in SPECS[: args.specs]:
            spec_file = work / f"spec{seed}.parquet"
            write_spec(spec_from_rows(spec_rows(seed, tables, share)), spec_file)
            topology = work / f"topology{seed}.yaml"
            topology.write_text(yaml.safe_dump({**topology_to_dict(read_topology(args.topology)), "batch_size": batch}))
            for made_under in ("default", "calibrated"):
                out = work / f"spec{seed}_{made_under}"
                extra = ["--profile", profile_path] if made_under == "calibrated" else []
                shardflow("plan", "--no-track", str(spec_file), "--topology", str(topology), "--out", str(out),
                          "--no-chart", *extra)
                plan = read_plan(out)
                mix: dict[str, int] = {}
                for t in plan.tables:
                    mix[t.sharding_type.value] = mix.get(t.sharding_type.value, 0) + 1
                plans.append({"spec": seed, "tables": tables, "batch_size": batch, "made_under": made_under,
                              "plan_id": plan.plan_id, "dir": str(out), "sharding": mix,
                              "predicted_default_ms": float(predicted_ms(plan, DEFAULT_PROFILE).max()),
                              "predicted_calibrated_ms": float(predicted_ms(plan, calibrated).max()),
                              "measured_ms": []})
        print(f"{len(plans)} plans; measuring each {args.repeats} times", flush=True)
        config = MeasureConfig(iterations=args.iterations, warmup=args.warmup)
        rng = random.Random(0)
        for repeat in range(args.repeats):
            order = list(range(len(plans)))
            if repeat:
                rng.shuffle(order)
            out = work / "measure" / f"round{repeat}"
            timings = run_measuring_job([str(Path(plans[i]["dir"]) / "plan.json") for i in order],
                                        read_plan(plans[0]["dir"]).topology, str(out), config, Ranks(),
                                        f"calibration-bench-{repeat}")
            assert timings is not None
            for i, times in zip(order, timings.plans, strict=True):
                entry = plans[i]
                report = measure_report(read_plan(entry["dir"]), times, timings.machine)  # as measure.json
                entry["measured_ms"].append(report.critical_path_measured)
                print(f"  repeat {repeat + 1}: spec {entry['spec']} {entry['made_under']:10s} "
                      f"{report.critical_path_measured:9.2f} ms", flush=True)
            loads.append(load())

    for entry in plans:
        runs = entry["measured_ms"]
        entry["measured_median_ms"] = float(np.median(runs))
        entry["spread"] = float((max(runs) - min(runs)) / np.median(runs))
        for model in ("default", "calibrated"):
            entry[f"error_{model}"] = entry[f"predicted_{model}_ms"] / entry["measured_median_ms"] - 1
        entry.pop("dir")
    measured = [e["measured_median_ms"] for e in plans]
    summary = {model: {"median_abs_error": float(np.median([abs(e[f"error_{model}"]) for e in plans])),
                       "spearman": spearman([e[f"predicted_{model}_ms"] for e in plans], measured)}
               for model in ("default", "calibrated")}
    choices = []
    for seed in sorted({e["spec"] for e in plans}):
        pair = {e["made_under"]: e for e in plans if e["spec"] == seed}
        d, c = pair["default"], pair["calibrated"]
        noise = max(d["spread"], c["spread"])
        ratio = c["measured_median_ms"] / d["measured_median_ms"]
        verdict = ("same plan" if d["plan_id"] == c["plan_id"] else "faster" if ratio < 1 - noise
                   else "slower" if ratio > 1 + noise else "same within noise")
        choices.append({"spec": seed, "default_ms": d["measured_median_ms"], "calibrated_ms": c["measured_median_ms"],
                        "ratio": ratio, "noise": noise, "verdict": verdict})

    print(f"\n{'spec':>4} {'made under':10} {'tables':>6} {'batch':>5} {'measured':>9} {'pred def':>9} {'err def':>8} "
          f"{'pred cal':>9} {'err cal':>8} {'spread':>6}  sharding")
    for e in plans:
        print(f"{e['spec']:>4} {e['made_under']:10} {e['tables']:>6} {e['batch_size']:>5} "
              f"{e['measured_median_ms']:9.2f} {e['predicted_default_ms']:9.3f} {e['error_default']:+8.1%} "
              f"{e['predicted_calibrated_ms']:9.2f} {e['error_calibrated']:+8.1%} {e['spread']:6.1%}  {e['sharding']}")
    for model, s in summary.items():
        print(f"{model:10s}: median |error| {s['median_abs_error']:.1%}, Spearman {s['spearman']:.3f}")
    print("\nplan chosen under each profile, measured:")
    for ch in choices:
        print(f"  spec {ch['spec']:>2}: default {ch['default_ms']:8.2f} ms, calibrated {ch['calibrated_ms']:8.2f} ms "
              f"({ch['ratio']:.2f}x, noise {ch['noise']:.0%}): {ch['verdict']}")
    result = {"cpus": os.cpu_count(), "topology": args.topology, "repeats": args.repeats, "calibration": calibration,
              "loads": loads, "plans": plans, "summary": summary, "choices": choices,
              "seconds": round(time.perf_counter() - began, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out} ({result['seconds']} s; load {loads[0]['load_1m']} before, "
          f"{loads[-1]['load_1m']} after)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
