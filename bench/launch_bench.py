"""What starting a training costs: torchrun's ranks (each a new interpreter that imports torch and
torchrec) against shardflow's launcher (``rec.train.launcher``: torchrun with every rank forked
from one forkserver that imported the job), side by side on this machine.

Both train one plan with the same job, flags and environment (``tasks.launch``): the demo plan on
2 gloo ranks (``--device cpu``), or the GPU check's DLRM on every visible GPU (cuda), alternating,
``--repeats`` times each. Per run: the wall time until every process of it has exited, the CPU time
of all of them (this script reaps the orphaned forkserver as a subreaper), and the training's p50
iteration latency (the ranks' work, which the launch must not change). Prints medians, spreads and
ratios; writes OUT/launch_bench.json (launch_bench_failing.json with ``--failing``).

``--failing``: rank 1 fails at iteration 2 (``SHARDFLOW_FAIL_AT_ITERATION``), no restart: what a
failed launch costs until every process has exited (torchrun's agent logs the failure, and torch's
log formatter imports torch._dynamo for it, which the launcher avoids; ``rec.train.elastic_internals``).

    .venv/bin/python bench/launch_bench.py --device cpu --repeats 5 --out /tmp/lb   # ~3 min on 2 cores
    .venv/bin/python bench/launch_bench.py --device cpu --repeats 5 --failing --out /tmp/lbf
    PYTHONPATH=. python3 -m bench.launch_bench --out /tmp/lb                        # on a GPU machine
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_check import workloads  # noqa: E402
from bench.gpu_check.machine import find_ranks, pick_device  # noqa: E402
from rec.sharding import ComputeDevice  # noqa: E402
from rec.train.config import FAIL_AT_ENV, TrainConfig  # noqa: E402
from rec.train.launcher import FORKSERVER_FLAG  # noqa: E402
from rec.train.lifetime import LAUNCHER_MODULE  # noqa: E402
from tasks.launch import Launch, job_environment, torchrun_command  # noqa: E402

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
WAYS = ("torchrun", "shardflow")
TORCHRUN = "torch.distributed.run"  # the reference: torchrun itself
FAILING = "2:1"  # --failing: rank 1 dies at iteration 2


def commands(plan: Path, out: Path, ranks: int, job: TrainConfig) -> dict[str, list[str]]:
    """The launch shardflow runs, and the same launch with torchrun itself (spawned ranks)."""
    ours = torchrun_command(Launch(plan_path=str(plan), out_dir=str(out), nproc_per_node=ranks, job=job))
    reference = [TORCHRUN if arg == LAUNCHER_MODULE else arg for arg in ours
                 if arg != FORKSERVER_FLAG]
    return {"shardflow": ours, "torchrun": reference}


def one_run(command: list[str], out: Path, log: Path, failing: bool) -> dict[str, float]:
    """Wall and CPU seconds until every process of the launch has exited, and the p50 latency (of a
    launch that succeeds)."""
    env = {**job_environment(), FAIL_AT_ENV: FAILING if failing else ""}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with log.open("a") as sink:
        code = subprocess.run(command, env=env, stdout=sink, stderr=subprocess.STDOUT).returncode
    while True:  # the forkserver outlives the launcher by a moment; it was handed to this subreaper
        try:
            os.wait()
        except ChildProcessError:
            break
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if (code == 0) == failing:
        sys.exit(f"launch_bench: {command[2]} exited {code}; see {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if failing:
        return {"wall_s": wall, "cpu_s": cpu}
    metrics = json.loads((out / "train_metrics.json").read_text())
    return {"wall_s": wall, "cpu_s": cpu, "p50_ms": metrics["iteration_latency_ms"]["p50"]}


def plan_for(device: ComputeDevice, work: Path) -> tuple[Path, int, TrainConfig]:
    """The plan both ways train, its ranks, and the job's settings."""
    ranks = find_ranks(device)
    if device is ComputeDevice.CPU:
        spec, topology = ROOT / "examples/specs/cpu_demo.yaml", ROOT / "examples/topologies/cpu_2proc.yaml"
        job = TrainConfig(iterations=20, warmup=4)
    else:
        workload = workloads.dlrm(ranks)
        spec, topology = work / "spec.yaml", work / "topology.yaml"
        spec.write_text(yaml.safe_dump({"tables": workload.rows}, sort_keys=False))
        topology.write_text(yaml.safe_dump(ranks.topology(workload.batch_size, workload.hbm_bytes), sort_keys=False))
        job = TrainConfig(iterations=200, warmup=50)
    plan = work / "plan"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "flows.cli", "plan", "--no-track", str(spec), "--topology", str(topology),
                    "--out", str(plan), "--no-chart"], env=env, check=True, stdout=subprocess.DEVNULL)
    return plan, ranks.world_size, job


def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = np.array([r[key] for r in runs])
        median = float(np.median(values))
        out[key] = {"median": median, "spread_pct": float(100 * (values.max() - values.min()) / median),
                    "runs": [round(float(v), 3) for v in values]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--failing", action="store_true", help="rank 1 fails at iteration 2: a failed launch's cost")
    p.add_argument("--out", required=True, help="the runs' files and launch_bench.json go here")
    a = p.parse_args()
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    device = pick_device(a.device)
    work = Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    plan, ranks, job = plan_for(device, work)
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for k in range(a.repeats):
        for way in WAYS:
            out = work / f"{way}_{k}"
            run = one_run(commands(plan, out, ranks, job)[way], out, work / "launches.log", a.failing)
            runs[way].append(run)
            p50 = "failed, as asked" if a.failing else f"p50 {run['p50_ms']:.3f} ms"
            print(f"launch_bench: {way:9s} run {k + 1}: {run['wall_s']:.1f} s wall, {run['cpu_s']:.1f} CPU-s, {p50}",
                  flush=True)
    result = {way: summary(runs[way]) for way in WAYS}
    ratios = {key: result["shardflow"][key]["median"] / result["torchrun"][key]["median"]
              for key in result["shardflow"]}
    report = {"device": device.value, "ranks": ranks, "iterations": job.iterations, "repeats": a.repeats,
              "failing": FAILING if a.failing else None, **result, "shardflow_over_torchrun": ratios}
    name = "launch_bench_failing.json" if a.failing else "launch_bench.json"
    (work / name).write_text(json.dumps(report, indent=1))
    for way in WAYS:
        r = result[way]
        p50 = "" if a.failing else f", p50 {r['p50_ms']['median']:.3f} ms ({r['p50_ms']['spread_pct']:.0f}%)"
        print(f"{way:9s} wall {r['wall_s']['median']:.1f} s (spread {r['wall_s']['spread_pct']:.0f}%), "
              f"CPU {r['cpu_s']['median']:.1f} s ({r['cpu_s']['spread_pct']:.0f}%){p50}")
    p50 = "" if a.failing else f", p50 iteration {ratios['p50_ms']:.2f}x"
    print(f"shardflow/torchrun: wall {ratios['wall_s']:.2f}x, CPU {ratios['cpu_s']:.2f}x{p50} "
          f"({ranks} {device.value} ranks{', rank 1 failing' if a.failing else ''})")


if __name__ == "__main__":
    main()
