"""TorchRec's plans against shardflow's, measured on the same ranks (issue 25).

Five shapes — few big tables, many small ones, pooling-heavy, memory-tight (on cuda: the topology's
HBM a third of the tables), EmbeddingBagCollections beside EmbeddingCollections — each planned by
TorchRec's `EmbeddingShardingPlanner` (its default proposers, and its DynamicProgrammingProposer where
it plans: not for cpu ranks) and by shardflow (TorchRec's default profile, and a profile calibrated on
these ranks); every distinct layout measured `--repeats` times in alternating order, in one launch
of `shardflow measure`'s job. Prints per shape and planner the plan time, the measured iteration time
with its spread ((max - min) / median of the repeats) and its ratio to TorchRec's default plan. The
same code is the `vs_torchrec` section of `python -m bench.gpu_check`; here on this machine's ranks
(2 gloo ranks on cpu; every GPU with `--device cuda`).

    .venv/bin/python bench/measured_vs_torchrec.py                       # cpu, ~6 min on 2 cores
    .venv/bin/python bench/measured_vs_torchrec.py --profile P.yaml      # skip calibrating
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--profile", default=None, help="a profile calibrated on these ranks (default: calibrate now)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=24, help="timed iterations per plan and repeat (3 blocks)")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "bench/results/measured_vs_torchrec.json"))
    args = p.parse_args()

    from bench.gpu_check import compare, workloads
    from bench.gpu_check.context import Context
    from bench.gpu_check.machine import find_ranks
    from rec.sharding import ComputeDevice
    from rec.train.measure_config import MeasureConfig

    ranks = find_ranks(ComputeDevice(args.device))
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="measured-vs-torchrec-") as tmp:
        ctx = Context(ranks, Path(tmp), time.monotonic() + 24 * 3600, Path(tmp, "commands.log"))
        calibration_s = None
        if args.profile:
            ctx.profile = Path(args.profile)
        else:
            topology = ctx.topology_file("calibrate", 512)
            ctx.profile = Path(tmp, "profile.yaml")
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "flows.cli", "calibrate", "--topology", str(topology), "--out",
                            str(ctx.profile), "--work", str(Path(tmp, "calibrate"))], check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
            calibration_s = round(time.perf_counter() - started, 1)
            print(f"calibrated on {ranks.world_size} {ranks.device.value} ranks in {calibration_s} s", flush=True)
        shapes = workloads.torchrec_shapes(ranks)
        config = MeasureConfig(iterations=args.iterations, warmup=args.warmup, blocks=3)
        compared = compare.compare_measured(ctx, shapes, args.repeats, 24 * 3600.0, config)
        repeats, results = compared.repeats, compared.shapes

    header = f"{'shape':14} {'planner':21} {'plan s':>8} {'measured ms':>12} {'spread':>7} {'vs TorchRec':>11}"
    print(f"\n{header}  {'verdict':17s} sharding")
    ratios = []
    for shape, row in results.items():
        for planner, entry in row.items():
            if not isinstance(entry, dict):
                continue
            if "error" in entry:
                print(f"{shape:14} {planner:21} {entry['plan_s']:8.2f} {'no plan: ' + entry['error'][:60]}")
                continue
            same = f" (= {', '.join(entry['same_layout_as'])})" if entry["same_layout_as"] else ""
            print(f"{shape:14} {planner:21} {entry['plan_s']:8.3f} {entry['measured_ms']:12.2f} {entry['spread']:7.1%} "
                  f"{entry['vs_torchrec']:11.3f}  {entry['verdict']:17s} {entry['sharding']}{same}")
            if planner == "shardflow-calibrated" and math.isfinite(entry["vs_torchrec"]):
                ratios.append(entry["vs_torchrec"])
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else math.nan
    print(f"\nshardflow (calibrated) / TorchRec's default plan, measured: geometric mean {geo:.3f} over {len(ratios)} "
          f"shapes; {time.perf_counter() - began:.0f} s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": ranks.device.value, "ranks": ranks.world_size, "repeats": repeats,
                                          "calibration_s": calibration_s, "shapes": results,
                                          "calibrated_vs_torchrec_geomean": geo, "cpus": os.cpu_count(),
                                          "load_1m": os.getloadavg()[0]}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
