"""A rank's memory over a long training: does it grow with the iterations?

Plans the bundled demo for 2 cpu ranks and runs ``shardflow train`` (synthetic batches, no
checkpoints, ``--no-track``) for ``--iterations`` at ``--batch-size``, with the code of this checkout
or of ``--code DIR`` (another checkout's root, e.g. ``git archive REV | tar -x -C DIR``: the same
bench, the code before a change). Every ``--every`` seconds it reads each rank's ``VmRSS`` (the
ranks' pids from their logs' first lines). It prints each rank's RSS at the first sample after the
warm-up, at the end, and the growth per 1,000 iterations (a least-squares slope over the samples
after the first quarter of the run), and writes the samples to ``--out`` (JSON).

    .venv/bin/python bench/rank_memory_bench.py --iterations 6000 --batch-size 512 --out bench/results/rank_memory.json
    .venv/bin/python bench/rank_memory_bench.py --code /tmp/before --label before ...

A training's own state is fixed in size (weights, optimizer, one batch in flight), so the target
is no growth beyond the noise: under ``TARGET_MIB_PER_1000`` a rank (exit 1 naming a rank above it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples/specs/cpu_demo.yaml"
TOPOLOGY = ROOT / "examples/topologies/cpu_2proc.yaml"
TARGET_MIB_PER_1000 = 5.0
_PID = re.compile(r"^== rank (\d+), .*pid (\d+),")


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rank_pids(logs: Path) -> dict[int, int]:
    pids = {}
    for log in logs.glob("rank-*.log"):
        try:
            first = log.open().readline()
        except OSError:
            continue
        if m := _PID.match(first):
            pids[int(m.group(1))] = int(m.group(2))
    return pids


def iteration_of(line: str) -> int | None:
    m = re.search(r"iteration (\d+)/", line)
    return int(m.group(1)) if m else None


def run(code: Path, work: Path, a: argparse.Namespace) -> dict[str, list[tuple[float, int, float]]]:
    """Per rank: (seconds since launch, last iteration shown, RSS MiB) samples."""
    env = {**os.environ, "PYTHONPATH": str(code), "PYTHONDONTWRITEBYTECODE": "1"}
    python = str(ROOT / ".venv/bin/python")
    plan, out = work / "plan", work / "out"
    subprocess.run([python, "-m", "flows.cli", "plan", "--no-track", str(DEMO), "--topology", str(TOPOLOGY),
                    "--out", str(plan)], env=env, cwd=code, check=True, capture_output=True)
    cmd = [python, "-m", "flows.cli", "train", "--no-track", "--plan", str(plan), "--out", str(out),
           "--iterations", str(a.iterations), "--warmup", "10", "--batch-size", str(a.batch_size)]
    began = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    shown = [0]
    samples: dict[str, list[tuple[float, int, float]]] = {}

    def read_progress() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            for part in line.split("\r"):
                if (i := iteration_of(part)) is not None:
                    shown[0] = i

    threading.Thread(target=read_progress, daemon=True).start()
    while proc.poll() is None:
        time.sleep(a.every)
        for rank, pid in rank_pids(out / "logs").items():
            rss = rss_mib(pid)
            if rss is not None:
                samples.setdefault(str(rank), []).append((time.monotonic() - began, shown[0], rss))
    if proc.returncode != 0:
        sys.exit(f"the training failed (exit {proc.returncode}); see {out / 'logs'}")
    return samples


def growth(samples: list[tuple[float, int, float]], iterations: int) -> float:
    """MiB per 1,000 iterations after the first quarter of the run (least squares)."""
    later = [(i, r) for _, i, r in samples if i >= iterations // 4]
    if len(later) < 3:
        return float("nan")
    x, y = np.array([i for i, _ in later], float), np.array([r for _, r in later])
    return float(np.polyfit(x, y, 1)[0] * 1000)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=6000)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--code", type=Path, default=ROOT, help="the checkout whose shardflow runs")
    p.add_argument("--label", default="this checkout")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="rank-memory-") as tmp:
        samples = run(a.code.resolve(), Path(tmp), a)
    missed = []
    print(f"{a.label}: {a.iterations:,} iterations of {a.batch_size} samples a rank, 2 cpu ranks")
    result = {}
    for rank, rows in sorted(samples.items()):
        after_warmup = next((r for _, i, r in rows if i >= 10), rows[0][2])
        slope = growth(rows, a.iterations)
        result[rank] = {"rss_after_warmup_mib": after_warmup, "rss_end_mib": rows[-1][2],
                        "growth_mib_per_1000_iterations": slope, "samples": rows}
        print(f"  rank {rank}: RSS {after_warmup:,.0f} MiB after the warm-up, {rows[-1][2]:,.0f} MiB at the end; "
              f"{slope:+.1f} MiB per 1,000 iterations")
        if not slope < TARGET_MIB_PER_1000:
            missed.append(f"rank {rank} grew {slope:.1f} MiB per 1,000 iterations (target < {TARGET_MIB_PER_1000})")
    if a.out:
        a.out.write_text(json.dumps({"label": a.label, "iterations": a.iterations, "batch_size": a.batch_size,
                                     "ranks": result}, indent=1) + "\n")
    for line in missed:
        print(f"missed: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
