"""shardflow vs TorchRec 1.8's planners and an exact MILP, side by side in one run.

For each workload: (a) the whole ``shardflow plan`` process (python start, reading a Parquet spec,
writing plan.json) and in-process ``plan_spec`` with the default settings; (b) in-process
``plan_spec`` with a longer exact stage (``--time-limit``, default 60 s, twice the default); (c) TorchRec's default
EmbeddingShardingPlanner; (d) TorchRec with DynamicProgrammingProposer; (e) the MILP over the same
options (``rec.search.milp``) solved by HiGHS from scratch, no warm start, for ``--milp-seconds``:
its best plan and its dual bound. Critical paths are TorchRec's own ratings: ``torchrec_score``
(TorchRec's enumerator, estimators and NoopPerfModel on shardflow's shards) for shardflow, the
planner's best-plan NoopPerfModel rating for TorchRec; the MILP's plan is rated by shardflow's cost
model (TorchRec rates shardflow's plans identically, see the score_vs_own column).

Workloads: TorchRec issue 2282's shape, Criteo 1TB and a mixed spec on 80 GiB H100s, and
memory-tight ones (``mem-*``: tables 3-10x the ranks' total HBM, batch 1024-4096, one and two
hosts), where the compute kernel (HBM, UVM cache, UVM) decides the time.

    .venv/bin/python bench/plan_bench.py [--quick] [--only mem-8-b2048 ...] [--milp-seconds 60]
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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rec.config.search import SearchConfig
from rec.hit_rates import CACHE_FRACTIONS
from rec.plan import PLAN_FILE, read_plan
from rec.planning import plan_spec
from rec.spec import write_spec
from rec.spec.synthetic import criteo_1tb_spec, issue2282_spec, mixed_spec
from rec.spec.types import Spec
from rec.topology import read_topology, topology_from_dict, topology_to_dict
from rec.topology.types import Topology

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = ROOT / "examples" / "topologies"
SHARDFLOW = Path(sys.executable).with_name("shardflow")


GiB = 2**30


@dataclass(frozen=True)
class Workload:
    name: str
    spec: Callable[[], Spec]
    topology: str  # an example file name, or "gpu_HxL_HBM_BATCH" built by gpu_topology
    quick: bool = False
    memory_tight: bool = False  # quality target: gap <= 15% (else 3%)


def gpu_topology(name: str) -> Topology:
    """``gpu_{hosts}x{ranks per host}_{HBM GiB}_{batch}``: H100-like ranks with that much HBM and
    128 GiB DDR each (for sizes without an example file)."""
    shape, hbm, batch = name.split("_")[1:]
    hosts, local = (int(x) for x in shape.split("x"))
    return topology_from_dict({"world_size": hosts * local, "local_world_size": local, "compute_device": "cuda",
                               "hbm_cap": f"{hbm}GiB", "ddr_cap": "128GiB", "batch_size": int(batch),
                               "storage_reservation": 0.15}, source=name)


def memory_tight_spec(n_tables: int, table_bytes: float, seed: int, stats: bool = False) -> Spec:
    """``n_tables`` tables (rows log-uniform, dims 32-256, a quarter FP16, pooling 1-40) scaled to
    ``table_bytes`` of weights and row-wise optimizer state in all; with ``stats``, each with a measured
    ``hit_rate_curve`` (``shardflow spec stats``'s fractions) of ids ``rows x u**s``, s from 1 (no
    skew) to 6 (a few rows serve most lookups)."""
    from rec.spec.validate import spec_from_rows

    rng = np.random.default_rng(seed)
    rows = 10 ** rng.uniform(5, 7.5, n_tables)
    dims = rng.choice((32, 64, 128, 256), n_tables)
    fp16 = rng.random(n_tables) < 0.25
    pooling = np.round(rng.uniform(1, 40, n_tables), 1)
    rows = np.maximum(1000, np.rint(rows * table_bytes / (rows * dims * np.where(fp16, 2, 4) + rows * 4).sum()))
    skew = rng.uniform(1.0, 6.0, n_tables)
    curves = [{"hit_rate_curve": [[f, round(f ** (1 / s), 6)] for f in CACHE_FRACTIONS]} if stats else {} for s in skew]
    return spec_from_rows([{"name": f"t{i:03d}", "num_embeddings": int(rows[i]), "embedding_dim": int(dims[i]),
                            "pooling_factor": float(pooling[i]), "data_type": "FP16" if fp16[i] else "FP32",
                            **curves[i]}
                           for i in range(n_tables)], source=f"memory_tight_spec({n_tables}, seed={seed})")


def _tight(name: str, n: int, hosts: int, local: int, hbm: int, batch: int, times_hbm: float, seed: int,
           quick: bool = False, stats: bool = False) -> Workload:
    total = times_hbm * hosts * local * hbm * GiB

    def spec() -> Spec:
        return memory_tight_spec(n, total, seed, stats)

    return Workload(name, spec, f"gpu_{hosts}x{local}_{hbm}_{batch}", quick=quick, memory_tight=True)


WORKLOADS = [
    *(Workload(f"issue2282-{n}", partial(issue2282_spec, n), "h100_1x8.yaml", quick=n == 100)
      for n in (100, 200, 500, 1000)),
    Workload("criteo-1tb-8", criteo_1tb_spec, "h100_1x8.yaml", quick=True),
    Workload("criteo-1tb-16", criteo_1tb_spec, "h100_2x8.yaml"),
    Workload("criteo-1tb-64", criteo_1tb_spec, "gpu_8x8_80_512"),
    Workload("mixed-16", mixed_spec, "h100_2x8.yaml"),
    _tight("mem-8-b2048", 60, 1, 8, 8, 2048, 5, seed=0, quick=True),
    _tight("mem-8-b4096", 50, 1, 8, 8, 4096, 4, seed=1),
    _tight("mem-8-x10", 40, 1, 8, 8, 1024, 10, seed=3),
    _tight("mem-16-2hosts", 120, 2, 8, 16, 1024, 6, seed=2),
    _tight("mem-64", 300, 8, 8, 16, 1024, 3, seed=5),
    _tight("mem-8-stats", 60, 1, 8, 8, 2048, 5, seed=7, stats=True),  # skewed ids, measured per table
    _tight("mem-16-stats", 120, 2, 8, 16, 1024, 6, seed=8, stats=True),
]


def load_topology(name: str, tmp: Path) -> tuple[Topology, Path]:
    """The topology and a YAML file the CLI reads it from."""
    if name.endswith(".yaml"):
        path = TOPOLOGIES / name
        return read_topology(path), path
    topology = gpu_topology(name)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topology_to_dict(topology)), encoding="utf-8")
    return topology, path


def time_cli(spec_path: Path, topology_path: Path, out: Path, repeat: int) -> list[float]:
    """Wall seconds of each ``shardflow plan`` process, start to exit."""
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run([str(SHARDFLOW), "plan", "--no-track", str(spec_path), "--topology", str(topology_path),
                               "--out", str(out)], capture_output=True, text=True)
        seconds.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"shardflow plan exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds


def run_torchrec(spec: Spec, topology: Topology, proposer, timeout_s: int | None) -> dict:
    from rec.torchrec.score import run_torchrec_planner

    try:
        return asdict(run_torchrec_planner(spec, topology, proposer=proposer, timeout_s=timeout_s))
    except Exception as e:  # a PlannerError is a result here, not a crash of the benchmark
        return {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}


def bench_workload(w: Workload, args: argparse.Namespace, tmp: Path) -> dict:
    from torchrec.distributed.planner.proposers import DynamicProgrammingProposer

    from rec.torchrec.score import torchrec_score

    spec = w.spec()
    topology, topology_path = load_topology(w.topology, tmp)
    spec_path = write_spec(spec, tmp / f"{w.name}.parquet")
    out = tmp / w.name
    result: dict = {"workload": w.name, "tables": len(spec.tables), "world_size": topology.world_size,
                    "local_world_size": topology.local_world_size, "topology": w.topology,
                    "memory_tight": w.memory_tight,
                    "loadavg_1m_at_start": os.getloadavg()[0]}  # other work on the machine skews timings

    cli_s = time_cli(spec_path, topology_path, out, args.repeat)
    cli_plan = read_plan(out / PLAN_FILE)
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
        "planning_s": min(in_process_s),  # plan.json v2 keeps no measured time
        "critical_path": score.critical_path,  # TorchRec's rating of shardflow's plan
        "own_critical_path": m.critical_path,
        "score_rel_diff": abs(score.critical_path - m.critical_path) / m.critical_path,
        "lower_bound": m.lower_bound, "gap": m.gap,
        "over_capacity_ranks": list(score.over_capacity),
        "same_plan_in_process": plan.plan_id == cli_plan.plan_id,
        "sharding_types": _count(t.sharding_type.value for t in cli_plan.tables),
    }
    result["shardflow"].update(bound_method=m.bound_method, optimal=m.optimal)
    _progress(f"{w.name}: shardflow cli {result['shardflow']['cli_s']:.2f}s "
              f"in-process {result['shardflow']['in_process_s']:.3f}s cp {score.critical_path:.6g}")

    started = time.perf_counter()
    long_plan = plan_spec(spec, topology, config=SearchConfig(time_limit_s=args.time_limit))
    long_s = time.perf_counter() - started
    long_score = torchrec_score(long_plan, spec, topology)
    lm = long_plan.metrics
    result["shardflow_long"] = {"time_limit_s": args.time_limit, "in_process_s": long_s,
                                "critical_path": long_score.critical_path, "lower_bound": lm.lower_bound,
                                "gap": lm.gap, "bound_method": lm.bound_method, "optimal": lm.optimal,
                                "over_capacity_ranks": list(long_score.over_capacity)}
    _progress(f"{w.name}: shardflow --time-limit {args.time_limit:g}: {long_s:.2f}s cp {long_score.critical_path:.6g}")

    if len(spec.tables) > args.torchrec_default_max_tables:
        result["torchrec_default"] = {"skipped": (
            f"{len(spec.tables)} tables > --torchrec-default-max-tables {args.torchrec_default_max_tables}: "
            "TorchRec's default planner takes many minutes here")}
    else:
        result["torchrec_default"] = run_torchrec(spec, topology, None, args.torchrec_timeout)
    _progress(f"{w.name}: torchrec default {_brief(result['torchrec_default'])}")
    result["torchrec_dp"] = run_torchrec(spec, topology, DynamicProgrammingProposer(), args.torchrec_timeout)
    _progress(f"{w.name}: torchrec dp {_brief(result['torchrec_dp'])}")
    result["milp"] = run_milp(spec, topology, args.milp_seconds, args.milp_max_columns)
    _progress(f"{w.name}: milp {result['milp']}")
    return result


def run_milp(spec: Spec, topology: Topology, seconds: float, max_columns: int) -> dict:
    """The plan problem as one MILP over all options, HiGHS from scratch (no warm start, one
    thread) for ``seconds``: the best plan's critical path and the dual bound."""
    from rec.search import build_search_space
    from rec.search.assignment import usage
    from rec.search.bound import lower_bound
    from rec.search.exact import integer_columns, model_options
    from rec.search.milp import MilpLimits, build_model, decode, solve

    space = build_search_space(spec, topology)
    options = model_options(space, np.inf)
    columns = integer_columns(space, options)
    if columns > max_columns:
        return {"skipped": f"{columns:,} integer columns > --milp-max-columns {max_columns:,}"}
    scale = lower_bound(space).value or 1.0
    model = build_model(space, options, scale, (0.0, np.inf))
    out = solve(model, MilpLimits(2**31 - 1, seconds))
    empty = usage(space, np.zeros(space.num_tables, np.int64), np.full(len(space.options.perf), -1, np.int32))
    plan = decode(model, space, out.values, empty) if out.values is not None else None
    return {"critical_path": plan.critical_path if plan is not None else None, "dual_bound": out.dual_bound,
            "status": out.status, "nodes": out.nodes, "seconds": round(out.seconds, 2), "columns": columns}


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
    """Timing table, quality table (critical paths, ms) and the quality targets met or not."""
    from rec.text_table import render_table

    def secs(r: dict) -> str:
        return f"{r['seconds']:.2f}" if "seconds" in r else ("skipped" if "skipped" in r else "error")

    def ratio(a: float | None, b: float | None, digits: int = 1) -> str:
        return f"{a / b:,.{digits}f}" if a is not None and b else "-"

    timing, quality, checks = [], [], []
    for r in results:
        sf, dflt, dp = r["shardflow"], r["torchrec_default"], r["torchrec_dp"]
        long, milp = r.get("shardflow_long", {}), r.get("milp", {})
        timing.append((r["workload"], r["tables"], r["world_size"], f"{sf['cli_s']:.2f}",
                       f"{sf['in_process_s']:.3f}", f"{long.get('in_process_s', 0):.2f}", secs(dflt), secs(dp),
                       ratio(dflt.get("seconds"), sf["cli_s"]), ratio(dp.get("seconds"), sf["cli_s"])))
        trec = [x for x in (dflt.get("critical_path"), dp.get("critical_path")) if x is not None]
        quality.append((r["workload"], f"{sf['critical_path']:.6g}", _fmt(long.get("critical_path")),
                        _fmt(dflt.get("critical_path")), _fmt(dp.get("critical_path")),
                        _fmt(milp.get("critical_path")), _fmt(milp.get("dual_bound")),
                        ratio(sf["critical_path"], min(trec, default=None), 4),
                        ratio(sf["critical_path"], milp.get("critical_path"), 4),
                        f"{sf['lower_bound']:.6g}", sf.get("bound_method", "?"), f"{100 * sf['gap']:.2f}%",
                        f"{100 * long.get('gap', np.nan):.2f}%", "yes" if sf.get("optimal") else "no",
                        f"{sf['score_rel_diff']:.1e}",
                        ",".join(map(str, sf["over_capacity_ranks"] + long.get("over_capacity_ranks", []))) or "none"))
        checks.append((r["workload"], *_targets(r, sf, min(trec, default=None), milp.get("critical_path")),
                       *_targets(r, long, min(trec, default=None), milp.get("critical_path"))))
    t = render_table(
        ("workload", "tables", "ranks", "sf_cli_s", "sf_inproc_s", "sf_long_s", "trec_default_s", "trec_dp_s",
         "default/sf_cli", "dp/sf_cli"),
        timing, right=("tables", "ranks", "sf_cli_s", "sf_inproc_s", "sf_long_s", "trec_default_s", "trec_dp_s",
                       "default/sf_cli", "dp/sf_cli"))
    q = render_table(
        ("workload", "cp_sf", "cp_sf_long", "cp_trec_default", "cp_trec_dp", "cp_milp", "milp_dual",
         "sf/best_trec", "sf/milp", "lower_bound", "bound_method", "sf_gap", "sf_long_gap", "optimal",
         "score_vs_own", "over_capacity"),
        quality, right=("cp_sf", "cp_sf_long", "cp_trec_default", "cp_trec_dp", "cp_milp", "milp_dual",
                        "sf/best_trec", "sf/milp", "lower_bound", "sf_gap", "sf_long_gap", "score_vs_own"))
    c = render_table(("workload", "default<=trec", "default<=1.02milp", "default_gap_ok",
                      "long<=trec", "long<=1.02milp", "long_gap_ok"), checks)
    notes = [f"{r['workload']}: TorchRec default {r['torchrec_default']['skipped']}"
             for r in results if "skipped" in r["torchrec_default"]]
    notes += [f"{r['workload']}: TorchRec {k} {r[k]['error']}" for r in results
              for k in ("torchrec_default", "torchrec_dp") if "error" in r[k]]
    notes += [f"{r['workload']}: MILP {r['milp']['skipped']}" for r in results if "skipped" in r.get("milp", {})]
    notes += [f"{r['workload']}: MILP {r['milp']['status']} after {r['milp']['seconds']} s, {r['milp']['nodes']} nodes"
              for r in results if "status" in r.get("milp", {})]
    return "\n\n".join([t, q, "targets (cp <= best TorchRec, <= 1.02x MILP's plan, gap <= 15% memory-tight "
                         "/ 3% else):\n" + c, *(["notes:\n" + "\n".join(f"  {n}" for n in notes)] if notes else [])])


def _targets(r: dict, sf: dict, trec: float | None, milp: float | None) -> tuple[str, str, str]:
    if "critical_path" not in sf:
        return "-", "-", "-"
    cp = sf["critical_path"]
    limit = 0.15 if r.get("memory_tight") else 0.03

    def ok(flag: bool | None) -> str:
        return "-" if flag is None else ("ok" if flag else "NO")

    return (ok(None if trec is None else cp <= trec * (1 + 1e-9)),
            ok(None if milp is None else cp <= 1.02 * milp), ok(sf["gap"] <= limit))


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def environment() -> dict:
    import torch
    import torchrec

    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "python": platform.python_version(),
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
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a small subset (issue2282-100, criteo-1tb-8, mem-8-b2048)")
    parser.add_argument("--only", nargs="*", metavar="WORKLOAD", help="run just these workloads")
    parser.add_argument("--torchrec-default-max-tables", type=int, default=200,
                        help="skip TorchRec's default planner above this many tables (default 200)")
    parser.add_argument("--torchrec-timeout", type=int, default=None,
                        help="timeout_seconds for TorchRec's planners (default: none)")
    parser.add_argument("--repeat", type=int, default=3, help="shardflow runs per workload; median reported")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="the second shardflow run's exact-stage time limit, seconds (default 60)")
    parser.add_argument("--milp-seconds", type=float, default=60.0,
                        help="time limit of the reference MILP run from scratch (default 60)")
    parser.add_argument("--milp-max-columns", type=int, default=200_000,
                        help="skip the reference MILP above this many integer columns (default 200,000)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "plan_bench.json")
    args = parser.parse_args(argv)

    logging.disable(logging.WARNING)  # TorchRec warns per topology, reservation and unsharded table
    warnings.simplefilter("ignore")
    workloads = [w for w in WORKLOADS if (w.quick or not args.quick) and (not args.only or w.name in args.only)]
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {"environment": environment(), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="plan_bench_") as tmp:
        for w in workloads:
            results.append(bench_workload(w, args, Path(tmp)))
            report["total_s"] = time.perf_counter() - started
            args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")  # partial results survive
    print(render(results))
    print(f"\ntotal {report['total_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
