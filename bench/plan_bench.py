"""shardflow vs TorchRec 1.8's planners, side by side in one run, all plans rated by TorchRec.

For each workload: (a) the whole ``shardflow plan`` process (python start, reading a Parquet spec,
writing plan.json) and in-process ``plan_spec``; (b) TorchRec's default EmbeddingShardingPlanner;
(c) TorchRec with DynamicProgrammingProposer. Critical paths are TorchRec's own ratings:
``score_plan`` (TorchRec's enumerator, estimators and NoopPerfModel on shardflow's shards) for
shardflow, the planner's best-plan NoopPerfModel rating for TorchRec.

    .venv/bin/python bench/plan_bench.py [--quick] [--torchrec-default-max-tables 200]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import yaml

from rec.plan import read_plan
from rec.planning import plan_spec
from rec.spec import write_spec
from rec.spec.synthetic import criteo_1tb_spec, issue2282_spec, mixed_spec
from rec.spec.types import Spec
from rec.topology import read_topology, topology_from_dict, topology_to_dict
from rec.topology.types import Topology

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = ROOT / "examples" / "topologies"
SHARDFLOW = Path(sys.executable).with_name("shardflow")


@dataclass(frozen=True)
class Workload:
    name: str
    spec: Callable[[], Spec]
    topology: str  # an example file name, or "h100_RxC" built by h100_topology
    quick: bool = False


def h100_topology(hosts: int) -> Topology:
    """``hosts`` x 8 H100 80GB, the example topologies' keys (for sizes without an example file)."""
    return topology_from_dict({"world_size": 8 * hosts, "local_world_size": 8, "compute_device": "cuda",
                               "hbm_cap": "80GiB", "ddr_cap": "128GiB", "batch_size": 512,
                               "storage_reservation": 0.15}, source=f"h100_{hosts}x8")


WORKLOADS = [
    *(Workload(f"issue2282-{n}", lambda n=n: issue2282_spec(n), "h100_1x8.yaml", quick=n == 100)
      for n in (100, 200, 500, 1000)),
    Workload("criteo-1tb-8", criteo_1tb_spec, "h100_1x8.yaml", quick=True),
    Workload("criteo-1tb-16", criteo_1tb_spec, "h100_2x8.yaml"),
    Workload("criteo-1tb-64", criteo_1tb_spec, "h100_8x8"),
    Workload("mixed-16", mixed_spec, "h100_2x8.yaml"),
]


def load_topology(name: str, tmp: Path) -> tuple[Topology, Path]:
    """The topology and a YAML file the CLI reads it from."""
    if name.endswith(".yaml"):
        path = TOPOLOGIES / name
        return read_topology(path), path
    topology = h100_topology(int(name.split("_")[1].split("x")[0]))
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topology_to_dict(topology)), encoding="utf-8")
    return topology, path


def time_cli(spec_path: Path, topology_path: Path, out: Path, repeat: int) -> list[float]:
    """Wall seconds of each ``shardflow plan`` process, start to exit."""
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run([str(SHARDFLOW), "plan", str(spec_path), "--topology", str(topology_path),
                               "--out", str(out)], capture_output=True, text=True)
        seconds.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"shardflow plan exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds


def run_torchrec(spec: Spec, topology: Topology, proposer, timeout_s: int | None) -> dict:
    from rec.plan.torchrec_score import run_torchrec_planner

    try:
        return asdict(run_torchrec_planner(spec, topology, proposer=proposer, timeout_s=timeout_s))
    except Exception as e:  # a PlannerError is a result here, not a crash of the benchmark
        return {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}


def bench_workload(w: Workload, args: argparse.Namespace, tmp: Path) -> dict:
    from rec.plan.torchrec_score import torchrec_score
    from torchrec.distributed.planner.proposers import DynamicProgrammingProposer

    spec = w.spec()
    topology, topology_path = load_topology(w.topology, tmp)
    spec_path = write_spec(spec, tmp / f"{w.name}.parquet")
    out = tmp / w.name
    result: dict = {"workload": w.name, "tables": len(spec.tables), "world_size": topology.world_size,
                    "local_world_size": topology.local_world_size, "topology": w.topology,
                    "loadavg_1m_at_start": os.getloadavg()[0]}  # other work on the machine skews timings

    cli_s = time_cli(spec_path, topology_path, out, args.repeat)
    cli_plan = read_plan(out / "plan.json")
    in_process_s = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        plan = plan_spec(spec, topology)
        in_process_s.append(time.perf_counter() - started)
    score = torchrec_score(cli_plan, spec, topology)
    m = cli_plan.metrics
    result["shardflow"] = {
        "cli_s": statistics.median(cli_s), "cli_s_all": cli_s,
        "in_process_s": statistics.median(in_process_s), "in_process_s_all": in_process_s,
        "planning_s": m.planning_s,
        "critical_path": score.critical_path,  # TorchRec's rating of shardflow's plan
        "own_critical_path": m.critical_path,
        "score_rel_diff": abs(score.critical_path - m.critical_path) / m.critical_path,
        "lower_bound": m.lower_bound, "gap": m.gap,
        "over_capacity_ranks": list(score.over_capacity),
        "same_plan_in_process": plan.plan_id == cli_plan.plan_id,
        "sharding_types": _count(t.sharding_type.value for t in cli_plan.tables),
    }
    _progress(f"{w.name}: shardflow cli {result['shardflow']['cli_s']:.2f}s "
              f"in-process {result['shardflow']['in_process_s']:.3f}s cp {score.critical_path:.6g}")

    if len(spec.tables) > args.torchrec_default_max_tables:
        result["torchrec_default"] = {"skipped": (
            f"{len(spec.tables)} tables > --torchrec-default-max-tables {args.torchrec_default_max_tables}: "
            "TorchRec's default planner takes many minutes here")}
    else:
        result["torchrec_default"] = run_torchrec(spec, topology, None, args.torchrec_timeout)
    _progress(f"{w.name}: torchrec default {_brief(result['torchrec_default'])}")
    result["torchrec_dp"] = run_torchrec(spec, topology, DynamicProgrammingProposer(), args.torchrec_timeout)
    _progress(f"{w.name}: torchrec dp {_brief(result['torchrec_dp'])}")
    return result


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items()))


def _brief(r: dict) -> str:
    if "seconds" in r:
        return f"{r['seconds']:.2f}s cp {r['critical_path']:.6g} ({r['num_proposals']} proposals)"
    return r.get("skipped") or r.get("error", "?")


def _progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def render(results: list[dict]) -> str:
    """Timing table, then quality table (TorchRec-rated critical paths, ms)."""
    from flows.text_table import render_table

    def secs(r: dict) -> str:
        return f"{r['seconds']:.2f}" if "seconds" in r else ("skipped" if "skipped" in r else "error")

    def ratio(a: float | None, b: float | None, digits: int = 1) -> str:
        return f"{a / b:,.{digits}f}" if a is not None and b else "-"

    def cp(r: dict) -> float | None:
        return r.get("critical_path")

    timing, quality = [], []
    for r in results:
        sf, dflt, dp = r["shardflow"], r["torchrec_default"], r["torchrec_dp"]
        timing.append((r["workload"], r["tables"], r["world_size"], f"{sf['cli_s']:.2f}",
                       f"{sf['in_process_s']:.3f}", secs(dflt), secs(dp),
                       ratio(dflt.get("seconds"), sf["cli_s"]), ratio(dp.get("seconds"), sf["cli_s"]),
                       ratio(dflt.get("seconds"), sf["in_process_s"], 0),
                       ratio(dp.get("seconds"), sf["in_process_s"], 0)))
        quality.append((r["workload"], f"{sf['critical_path']:.6g}", _fmt(cp(dflt)), _fmt(cp(dp)),
                        ratio(sf["critical_path"], cp(dflt), 4), ratio(sf["critical_path"], cp(dp), 4),
                        f"{sf['lower_bound']:.6g}", f"{100 * sf['gap']:.2f}%", f"{sf['score_rel_diff']:.1e}",
                        ",".join(map(str, sf["over_capacity_ranks"])) or "none"))
    t = render_table(
        ("workload", "tables", "ranks", "sf_cli_s", "sf_inproc_s", "trec_default_s", "trec_dp_s",
         "default/sf_cli", "dp/sf_cli", "default/sf_inproc", "dp/sf_inproc"),
        timing, right=("tables", "ranks", "sf_cli_s", "sf_inproc_s", "trec_default_s", "trec_dp_s",
                       "default/sf_cli", "dp/sf_cli", "default/sf_inproc", "dp/sf_inproc"))
    q = render_table(
        ("workload", "cp_shardflow", "cp_trec_default", "cp_trec_dp", "sf/default", "sf/dp",
         "lower_bound", "sf_gap", "score_vs_own", "over_capacity"),
        quality, right=("cp_shardflow", "cp_trec_default", "cp_trec_dp", "sf/default", "sf/dp",
                        "lower_bound", "sf_gap", "score_vs_own"))
    notes = [f"{r['workload']}: TorchRec default {r['torchrec_default']['skipped']}"
             for r in results if "skipped" in r["torchrec_default"]]
    notes += [f"{r['workload']}: TorchRec {k} {r[k]['error']}" for r in results
              for k in ("torchrec_default", "torchrec_dp") if "error" in r[k]]
    return "\n\n".join([t, q, *(["notes:\n" + "\n".join(f"  {n}" for n in notes)] if notes else [])])


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def environment() -> dict:
    import torch
    import torchrec

    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
            "torch": torch.__version__, "torchrec": torchrec.__version__, "machine": platform.machine(),
            "processor": platform.processor(), "cpus": _cpus(), "command": " ".join(sys.argv), **_git()}


def _git() -> dict:
    """The commit benchmarked and the uncommitted files of the library and CLI, if any."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    dirty = git("status", "--porcelain", "--", "rec", "flows")
    return {"commit": git("rev-parse", "HEAD"), "uncommitted": dirty.splitlines()}


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small subset (issue2282-100, criteo-1tb-8)")
    parser.add_argument("--only", nargs="*", metavar="WORKLOAD", help="run just these workloads")
    parser.add_argument("--torchrec-default-max-tables", type=int, default=200,
                        help="skip TorchRec's default planner above this many tables (default 200)")
    parser.add_argument("--torchrec-timeout", type=int, default=None,
                        help="timeout_seconds for TorchRec's planners (default: none)")
    parser.add_argument("--repeat", type=int, default=3, help="shardflow runs per workload; median reported")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "plan_bench.json")
    args = parser.parse_args(argv)

    logging.disable(logging.WARNING)  # TorchRec warns per topology, reservation and unsharded table
    warnings.simplefilter("ignore")
    workloads = [w for w in WORKLOADS if (w.quick or not args.quick) and (not args.only or w.name in args.only)]
    report = {"environment": environment(), "results": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="plan_bench_") as tmp:
        for w in workloads:
            report["results"].append(bench_workload(w, args, Path(tmp)))
            report["total_s"] = time.perf_counter() - started
            args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")  # partial results survive
    print(render(report["results"]))
    print(f"\ntotal {report['total_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
