"""What `shardflow run` costs before and around the flow: Prefect's ephemeral API started by
shardflow (the server's code kept out of the command's process, the flow's and MLflow's modules
loaded while it starts; `flows/ephemeral_api.py`) against Prefect's own start of the same server
(`SubprocessASGIServer`, as shardflow did before), side by side on this machine.

Both run `shardflow run --plan-only` on the demo spec and 2 cpu ranks from this checkout,
alternating, `--repeats` times each, on one warm Prefect home and one MLflow store (a first, untimed
run creates both). Per run: the command's wall time and the CPU time of it and its children (the
server included). Prints medians, spreads and the ratio; writes bench/results/startup_bench.json.

    .venv/bin/python bench/startup_bench.py --repeats 5        # ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples/specs/cpu_demo.yaml"
TOPOLOGY = ROOT / "examples/topologies/cpu_2proc.yaml"

# The reference: the CLI with its ephemeral API started by Prefect's own server class.
PREFECTS_OWN_START = """
import contextlib, sys
import flows.ephemeral_api as api

@contextlib.contextmanager
def prefects_own(meanwhile=()):
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        yield
        return
    server = SubprocessASGIServer()
    server.start(timeout=api.startup_budget_s())
    try:
        yield
    finally:
        server.stop()

api.ephemeral_api = prefects_own
from flows.cli import main
sys.exit(main(sys.argv[1:]))
"""
WAYS = {"shardflow": [sys.executable, "-m", "flows.cli"], "prefect": [sys.executable, "-c", PREFECTS_OWN_START]}


def one_run(way: str, work: Path, index: int, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and its children) of one ``run --plan-only``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    command = [*WAYS[way], "run", "--plan-only", str(DEMO), "--topology", str(TOPOLOGY), "--out",
               str(work / f"{way}-{index}"), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", "--no-chart"]
    r = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{way}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: np.ndarray) -> float:
    return float((values.max() - values.min()) / np.median(values))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "bench/results/startup_bench.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        env.update(PREFECT_HOME=str(work / "prefect-home"), PYTHONPATH=str(ROOT))
        one_run("shardflow", work, -1, env)  # creates Prefect's database and the MLflow store: untimed
        runs: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
        for i in range(args.repeats):
            for way in (WAYS if i % 2 == 0 else reversed(list(WAYS))):
                runs[way].append(one_run(way, work, i, env))
                print(f"  {way:9s} run {i + 1}: {runs[way][-1][0]:5.1f} s wall, {runs[way][-1][1]:5.1f} s CPU",
                      flush=True)
    summary = {}
    for way, values in runs.items():
        wall, cpu = (np.array([v[k] for v in values]) for k in (0, 1))
        summary[way] = {"wall_s": float(np.median(wall)), "wall_spread": spread(wall),
                        "cpu_s": float(np.median(cpu)), "cpu_spread": spread(cpu)}
    ratio = {k: summary["shardflow"][k] / summary["prefect"][k] for k in ("wall_s", "cpu_s")}
    print(f"\n`shardflow run --plan-only` on the demo, {args.repeats} runs each (median, spread):")
    for way, s in summary.items():
        print(f"  {way:9s} wall {s['wall_s']:5.1f} s ({s['wall_spread']:.0%})   CPU {s['cpu_s']:5.1f} s "
              f"({s['cpu_spread']:.0%})")
    print(f"  shardflow's start / Prefect's own: wall {ratio['wall_s']:.2f}x, CPU {ratio['cpu_s']:.2f}x")
    Path(args.out).write_text(json.dumps({"repeats": args.repeats, "summary": summary, "ratio": ratio,
                                          "runs": runs}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
