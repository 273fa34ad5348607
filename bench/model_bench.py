"""A whole model of several embedding modules, planned by shardflow and by TorchRec's planner.

The workload is a two-tower model with a sequence tower: a user tower and an item tower
(EmbeddingBagCollections at ``towers.user.ebc``, ``towers.item.ebc``) and a sequence encoder (an
EmbeddingCollection at ``sequence.encoder.ec``: unpooled, one embedding per id of a user's history,
sequence lengths 20-200), 128 tables in all. TorchRec's ``EmbeddingShardingPlanner.plan(model,
sharders)`` with its default proposers plans the same module tree (``rec.torchrec.score``:
the spec's modules at their paths on the meta device, both sharders, the same constraints, topology
and storage reservation). Both plans are rated in TorchRec's units: TorchRec's ``NoopPerfModel`` on
its own best plan, and on shardflow's shards and ranks (``torchrec_score``).

shardflow is timed as the whole ``shardflow plan`` process (Parquet spec in, plan.json out; median
of ``--repeat``) and in process (``plan_spec``); TorchRec's planner in process, once.

Two more workloads (``weighted-8``, ``weighted-16``) hold a weighted EmbeddingBagCollection
(id-score lists, ``is_weighted``) beside an unweighted one, as TorchRec's ``TestSparseNN`` does.

    .venv/bin/python bench/model_bench.py [--only two-tower-seq-8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rec.plan import PLAN_FILE, read_plan
from rec.planning import plan_spec
from rec.spec import write_spec
from rec.spec.types import Spec
from rec.spec.validate import spec_from_rows
from rec.topology import read_topology

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = ROOT / "examples" / "topologies"
SHARDFLOW = Path(sys.executable).with_name("shardflow")
USER, ITEM, SEQUENCE = "towers.user.ebc", "towers.item.ebc", "sequence.encoder.ec"


def two_tower_seq_spec(seed: int = 0) -> Spec:
    """128 tables in three modules. Per tower: 2 id tables with 10^7.5-10^8.3 rows, 14 medium
    (10^5-10^7 rows, dims 32-256, a few shared by 2-3 features), 32 small (10-10^4 rows); the
    sequence EmbeddingCollection: 32 tables of one dim (64), ids of 10^3-10^7.5 rows, sequence
    lengths (pooling factors) 20-200. Names are unique: TorchRec keys constraints by name alone."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for tower, module in (("user", USER), ("item", ITEM)):
        for i in range(2):
            rows.append({"name": f"{tower}_id_{i}", "num_embeddings": int(10 ** rng.uniform(7.5, 8.3)),
                         "embedding_dim": 128, "data_type": "FP16" if i else "FP32",
                         "pooling_factor": float(np.round(rng.uniform(1, 3), 1)), "module": module})
        for i in range(14):
            name = f"{tower}_medium_{i:02d}"
            features = int(rng.choice((1, 1, 1, 2, 3)))
            rows.append({"name": name, "num_embeddings": int(10 ** rng.uniform(5, 7)),
                         "embedding_dim": int(rng.choice((32, 64, 128, 256))),
                         "feature_names": [name] if features == 1 else [f"{name}_f{j}" for j in range(features)],
                         "pooling": "MEAN" if i % 5 == 2 else "SUM",
                         "pooling_factor": float(np.round(rng.uniform(1, 40), 1)), "module": module})
        for i in range(32):
            rows.append({"name": f"{tower}_small_{i:02d}", "num_embeddings": int(10 ** rng.uniform(1, 4)),
                         "embedding_dim": int(rng.choice((16, 32, 64))),
                         "pooling_factor": float(np.round(rng.uniform(1, 4), 1)), "module": module})
    for i in range(32):
        rows.append({"name": f"sequence_{i:02d}", "num_embeddings": int(10 ** rng.uniform(3, 7.5)),
                     "embedding_dim": 64, "pooling": "NONE",
                     "pooling_factor": float(np.round(rng.uniform(20, 200), 1)), "module": SEQUENCE})
    return spec_from_rows(rows, source=f"two_tower_seq_spec(seed={seed})")


SPARSE, WEIGHTED = "sparse.ebc", "sparse.weighted_ebc"


def weighted_spec(seed: int = 0) -> Spec:
    """A ranking model's two kinds of sparse features, as TorchRec's ``TestSparseNN`` holds them: 48
    id lists in an EmbeddingBagCollection at ``sparse.ebc`` (2 id tables of 10^7.5-10^8 rows, 14
    medium, 32 small) and 32 id-score lists in a weighted one at ``sparse.weighted_ebc``
    (``is_weighted``: 10^3-10^7.5 rows, dims 32-128, 5-100 scored ids per sample)."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for i in range(2):
        rows.append({"name": f"id_{i}", "num_embeddings": int(10 ** rng.uniform(7.5, 8)), "embedding_dim": 128,
                     "pooling_factor": float(np.round(rng.uniform(1, 3), 1)), "module": SPARSE})
    for i in range(14):
        rows.append({"name": f"medium_{i:02d}", "num_embeddings": int(10 ** rng.uniform(5, 7)),
                     "embedding_dim": int(rng.choice((32, 64, 128, 256))),
                     "pooling_factor": float(np.round(rng.uniform(1, 40), 1)), "module": SPARSE})
    for i in range(32):
        rows.append({"name": f"small_{i:02d}", "num_embeddings": int(10 ** rng.uniform(1, 4)),
                     "embedding_dim": int(rng.choice((16, 32, 64))),
                     "pooling_factor": float(np.round(rng.uniform(1, 4), 1)), "module": SPARSE})
    for i in range(32):
        rows.append({"name": f"scored_{i:02d}", "num_embeddings": int(10 ** rng.uniform(3, 7.5)),
                     "embedding_dim": int(rng.choice((32, 64, 128))), "is_weighted": True,
                     "pooling_factor": float(np.round(rng.uniform(5, 100), 1)), "module": WEIGHTED})
    return spec_from_rows(rows, source=f"weighted_spec(seed={seed})")


@dataclass(frozen=True)
class Workload:
    name: str
    spec: Callable[[], Spec]
    topology: str  # a file in examples/topologies


WORKLOADS = [
    Workload("two-tower-seq-8", two_tower_seq_spec, "h100_1x8.yaml"),
    Workload("two-tower-seq-16", two_tower_seq_spec, "h100_2x8.yaml"),
    Workload("weighted-8", weighted_spec, "h100_1x8.yaml"),
    Workload("weighted-16", weighted_spec, "h100_2x8.yaml"),
]


def bench_workload(w: Workload, repeat: int, tmp: Path) -> dict[str, Any]:
    from rec.torchrec.score import run_torchrec_planner, torchrec_score

    spec = w.spec()
    topology_path = TOPOLOGIES / w.topology
    topology = read_topology(topology_path)
    spec_path = write_spec(spec, tmp / f"{w.name}.parquet")
    out = tmp / w.name
    result: dict[str, Any] = {
        "workload": w.name, "tables": len(spec.tables), "world_size": topology.world_size,
        "topology": w.topology, "modules": {path: kind.value for path, kind in spec.modules.items()},
        "tables_per_module": _count(t.module for t in spec.tables),
        "weighted_tables": sum(t.is_weighted for t in spec.tables),
        "loadavg_1m_at_start": os.getloadavg()[0],  # other work on the machine skews timings
    }
    cli_s = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run([str(SHARDFLOW), "plan", "--no-track", str(spec_path), "--topology", str(topology_path),
                               "--out", str(out), "--no-chart"], capture_output=True, text=True)
        cli_s.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"shardflow plan exited {done.returncode}:\n{done.stderr[-2000:]}")
    plan = read_plan(out / PLAN_FILE)
    in_process_s = []
    for _ in range(repeat):
        started = time.perf_counter()
        again = plan_spec(spec, topology)
        in_process_s.append(time.perf_counter() - started)
    score = torchrec_score(plan, spec, topology)
    m = plan.metrics
    result["shardflow"] = {
        "cli_s": statistics.median(cli_s), "cli_s_all": cli_s,
        "in_process_s": statistics.median(in_process_s), "in_process_s_all": in_process_s,
        "critical_path": score.critical_path, "own_critical_path": m.critical_path,
        "score_rel_diff": abs(score.critical_path - m.critical_path) / m.critical_path,
        "lower_bound": m.lower_bound, "gap": m.gap, "bound_method": m.bound_method, "optimal": m.optimal,
        "over_capacity_ranks": list(score.over_capacity), "same_plan_in_process": again.plan_id == plan.plan_id,
        "sharding_types": _count(t.sharding_type.value for t in plan.tables),
        "sharding_types_per_module": {path: _count(t.sharding_type.value for t in plan.tables if t.module == path)
                                      for path in spec.modules},
    }
    _progress(f"{w.name}: shardflow cli {result['shardflow']['cli_s']:.2f}s in-process "
              f"{result['shardflow']['in_process_s']:.3f}s cp {score.critical_path:.6g}")
    try:
        result["torchrec"] = asdict(run_torchrec_planner(spec, topology))
    except Exception as e:  # a PlannerError is a result here, not a crash of the benchmark
        result["torchrec"] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
    trec = result["torchrec"]
    if "critical_path" in trec:
        result["cp_ratio"] = score.critical_path / trec["critical_path"]  # < 1: shardflow's plan is better
        result["time_ratio_cli"] = result["shardflow"]["cli_s"] / trec["seconds"]
        result["time_ratio_in_process"] = result["shardflow"]["in_process_s"] / trec["seconds"]
        _progress(f"{w.name}: torchrec {trec['seconds']:.1f}s cp {trec['critical_path']:.6g}; "
                  f"cp sf/trec {result['cp_ratio']:.4f}, time sf_cli/trec {result['time_ratio_cli']:.4f}")
    else:
        _progress(f"{w.name}: torchrec {trec['error']}")
    return result


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items()))


def _progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def environment() -> dict[str, Any]:
    import platform
    from datetime import UTC, datetime

    import torch
    import torchrec

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "rec", "flows", "bench"], cwd=ROOT,
                           capture_output=True, text=True).stdout.splitlines()
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "python": platform.python_version(),
            "torch": torch.__version__, "torchrec": torchrec.__version__, "machine": platform.machine(),
            "cpus": len(os.sched_getaffinity(0)), "command": " ".join(sys.argv), "commit": commit,
            "uncommitted": dirty}


def render(results: list[dict[str, Any]]) -> str:
    from rec.text_table import render_table

    rows = []
    for r in results:
        sf, trec = r["shardflow"], r["torchrec"]
        rows.append((r["workload"], r["tables"], r["world_size"], f"{sf['cli_s']:.2f}", f"{sf['in_process_s']:.3f}",
                     f"{trec['seconds']:.1f}" if "seconds" in trec else "error",
                     f"{sf['critical_path']:.6g}", f"{trec['critical_path']:.6g}" if "critical_path" in trec else "-",
                     f"{r['cp_ratio']:.4f}" if "cp_ratio" in r else "-",
                     f"{r['time_ratio_cli']:.4f}" if "time_ratio_cli" in r else "-",
                     f"{100 * sf['gap']:.2f}%", f"{sf['score_rel_diff']:.1e}",
                     ",".join(map(str, sf["over_capacity_ranks"])) or "none",
                     "ok" if "cp_ratio" in r and r["cp_ratio"] <= 1 + 1e-9 else "NO"))
    columns = ("workload", "tables", "ranks", "sf_cli_s", "sf_inproc_s", "trec_s", "cp_sf", "cp_trec", "sf/trec_cp",
               "sf_cli/trec_s", "sf_gap", "score_vs_own", "over_capacity", "cp<=trec")
    return render_table(columns, rows, right=columns[1:12])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", metavar="WORKLOAD", help="run just these workloads")
    parser.add_argument("--repeat", type=int, default=3, help="shardflow runs per workload; median reported")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "model_bench.json")
    args = parser.parse_args(argv)

    logging.disable(logging.WARNING)  # TorchRec warns per topology, reservation and unsharded table
    warnings.simplefilter("ignore")
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {"environment": environment(), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="model_bench_") as tmp:
        for w in WORKLOADS:
            if args.only and w.name not in args.only:
                continue
            results.append(bench_workload(w, args.repeat, Path(tmp)))
            report["total_s"] = time.perf_counter() - started
            args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")  # partial results survive
    print(render(results))
    print(f"\ntotal {report['total_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
