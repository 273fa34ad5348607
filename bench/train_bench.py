"""Training loop vs TrainPipelineSparseDist, side by side on the same plan, in one run.

Runs `shardflow train` (real torchrun, gloo on CPU / NCCL on GPU) with `--pipeline naive` and
`--pipeline sparse_dist`, alternating, and prints iteration latency and the ratio.

    .venv/bin/python bench/train_bench.py                    # CPU demo, 2 processes
    .venv/bin/python bench/train_bench.py --spec S --topology T --nproc-per-node 8   # a GPU host
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARDFLOW = Path(sys.executable).parent / "shardflow"
sys.path.insert(0, str(ROOT))

from rec.train.metrics import METRICS_FILE  # noqa: E402


def shardflow(*args: str) -> str:
    """``shardflow ARGS`` from the repository root; its output, or RuntimeError with the end of it."""
    r = subprocess.run([str(SHARDFLOW), *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"shardflow {' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", default=str(ROOT / "examples/specs/cpu_demo.yaml"))
    p.add_argument("--topology", default=str(ROOT / "examples/topologies/cpu_2proc.yaml"))
    p.add_argument("--nproc-per-node", type=int, default=None)
    p.add_argument("--iterations", type=int, default=120)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--repeats", type=int, default=2, help="alternating runs per pipeline")
    p.add_argument("--out", default=str(ROOT / "bench/results/train_bench.json"))
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        plan_dir = Path(tmp) / "plan"
        shardflow("plan", "--no-track", args.spec, "--topology", args.topology, "--out", str(plan_dir))
        for repeat in range(args.repeats):
            for pipeline in ("naive", "sparse_dist"):
                out = Path(tmp) / f"{pipeline}_{repeat}"
                cmd = ["train", "--plan", str(plan_dir), "--out", str(out), "--pipeline", pipeline,
                       "--iterations", str(args.iterations), "--warmup", str(args.warmup)]
                if args.nproc_per_node:
                    cmd += ["--nproc-per-node", str(args.nproc_per_node)]
                if args.batch_size:
                    cmd += ["--batch-size", str(args.batch_size)]
                began = time.perf_counter()
                shardflow(*cmd)
                m = json.loads((out / METRICS_FILE).read_text())
                row = {"pipeline": pipeline, "repeat": repeat, "wall_s": round(time.perf_counter() - began, 1),
                       "world_size": m["world_size"], "batch_size": m["batch_size"], "model": m["model"],
                       **{f"{k}_ms": round(v, 3) for k, v in m["iteration_latency_ms"].items()},
                       "samples_per_s": round(m["samples_per_s"])}
                rows.append(row)
                print(json.dumps(row), flush=True)
    best = {pl: min(r["p50_ms"] for r in rows if r["pipeline"] == pl) for pl in ("naive", "sparse_dist")}
    summary = {"p50_naive_ms": best["naive"], "p50_sparse_dist_ms": best["sparse_dist"],
               "speedup": round(best["naive"] / best["sparse_dist"], 3)}
    print(f"\np50 iteration latency: naive {best['naive']:.2f} ms, TrainPipelineSparseDist "
          f"{best['sparse_dist']:.2f} ms -> {summary['speedup']:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
