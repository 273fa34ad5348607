"""Replanning after schema changes: how much a replan with ``--previous`` moves, against a plan
searched from scratch, side by side in one run.

For each workload, a sequence of schema changes (add 1-10% tables, grow some tables' rows 2x,
change a dim, remove a few) is applied one after another. At every step both plans are made for
the changed spec: shardflow's replan with the previous step's plan as ``previous`` (default
``--max-regress``), and a plan from scratch. Printed per step: the share of bytes each moves
(``rec.plan.movement``), the floor no plan can go below (``rec.search.least_moved.movement_floor``:
e.g. a grown row-wise table moves the rows its new even split shifts, wherever it goes), the
replan's critical path over the fresh one, and the share of tables the step changed.

    .venv/bin/python bench/replan_bench.py [--only WORKLOAD ...] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rec.config.cost import CostConfig
from rec.plan.movement import movement
from rec.planning import plan_spec, replan_spec
from rec.search import build_search_space
from rec.search.least_moved import movement_floor
from rec.search.warm import previous_placement
from rec.spec import spec_from_rows
from rec.spec.columns import table_to_row
from rec.spec.synthetic import criteo_1tb_spec, issue2282_spec, mixed_spec
from rec.spec.types import Spec
from rec.topology import topology_from_dict
from rec.topology.types import Topology

ROOT = Path(__file__).resolve().parents[1]
CHANGES = ("add", "grow", "dim", "remove", "add", "grow", "add", "remove", "grow", "add", "dim", "add")


def h100(hosts: int, per_host: int = 8) -> Topology:
    return topology_from_dict({"world_size": hosts * per_host, "local_world_size": per_host,
                               "compute_device": "cuda", "hbm_cap": "80GiB", "ddr_cap": "128GiB",
                               "batch_size": 512}, source=f"h100_{hosts}x{per_host}")


@dataclass(frozen=True)
class Workload:
    name: str
    spec: Callable[[], Spec]
    topology: Callable[[], Topology]


WORKLOADS = [
    Workload("criteo-1tb-16", criteo_1tb_spec, lambda: h100(2)),
    Workload("criteo-1tb-64", criteo_1tb_spec, lambda: h100(8)),
    Workload("mixed-150-2hosts", mixed_spec, lambda: h100(2)),
    Workload("issue2282-500", lambda: issue2282_spec(500), lambda: h100(1)),
]


def change(rows: list[dict], kind: str, step: int, rng: np.random.Generator) -> tuple[list[dict], int]:
    """The spec rows after one schema change, and how many tables it touched."""
    rows = [dict(r) for r in rows]
    n = len(rows)
    if kind == "add":
        k = max(1, round(n * rng.uniform(0.01, 0.10)))
        for i in range(k):
            like = rows[int(rng.integers(n))]
            name = f"added_{step}_{i}"
            rows.append({**like, "name": name, "feature_names": [name]})
        return rows, k
    if kind == "grow":
        k = max(1, round(n * 0.03))
        for i in rng.choice(n, size=k, replace=False):
            rows[i]["num_embeddings"] *= 2
        return rows, k
    if kind == "dim":
        i = int(rng.integers(n))
        rows[i]["embedding_dim"] = rows[i]["embedding_dim"] * 2
        return rows, 1
    k = max(1, min(3, n // 20))
    for i in sorted(rng.choice(n, size=k, replace=False), reverse=True):
        rows.pop(int(i))
    return rows, k


def bench(w: Workload, steps: int) -> list[dict]:
    topology = w.topology()
    rng = np.random.default_rng(0)
    spec = w.spec()
    previous = plan_spec(spec, topology)
    fresh_previous = previous
    out = []
    for step in range(steps):
        kind = CHANGES[step % len(CHANGES)]
        rows, touched = change([table_to_row(t) for t in spec.tables], kind, step, rng)
        spec = spec_from_rows(rows, source=f"{w.name} step {step}")
        started = time.perf_counter()
        replanned = replan_spec(spec, topology, previous)
        seconds = time.perf_counter() - started
        fresh = replanned.fresh
        ours = movement(previous, replanned.plan)
        space = build_search_space(spec, topology)
        floor = movement_floor(space, previous_placement(space, spec, previous, CostConfig()))
        theirs = movement(fresh_previous, fresh)
        out.append({
            "workload": w.name, "step": step, "change": kind, "tables": len(spec.tables),
            "changed_fraction": touched / len(spec.tables),
            "moved_fraction": ours.moved_fraction, "fresh_moved_fraction": theirs.moved_fraction,
            "floor_fraction": floor / ours.total_bytes if ours.total_bytes else 0.0,
            "critical_path_ratio": replanned.plan.metrics.critical_path / fresh.metrics.critical_path,
            "seconds": seconds,
        })
        print(f"[{time.strftime('%H:%M:%S')}] {w.name} step {step} {kind}: moved "
              f"{ours.moved_fraction:.2%} (fresh {theirs.moved_fraction:.2%}), cp x"
              f"{out[-1]['critical_path_ratio']:.4f}", file=sys.stderr, flush=True)
        previous, fresh_previous = replanned.plan, fresh
    return out


def render(results: list[dict]) -> str:
    from rec.text_table import render_table

    rows = [(r["workload"], r["step"], r["change"], r["tables"], f"{r['changed_fraction']:.1%}",
             f"{r['moved_fraction']:.2%}", f"{r['floor_fraction']:.2%}", f"{r['fresh_moved_fraction']:.2%}",
             f"{r['critical_path_ratio']:.4f}",
             f"{r['seconds']:.2f}") for r in results]
    table = render_table(("workload", "step", "change", "tables", "changed", "moved", "floor", "fresh_moved",
                          "cp/fresh", "replan_s"), rows,
                         right=("step", "tables", "changed", "moved", "floor", "fresh_moved", "cp/fresh", "replan_s"))
    small = [r for r in results if r["changed_fraction"] <= 0.05]
    summary = (f"\nsteps changing <= 5% of tables: {len(small)}; moved <= 10% in "
               f"{sum(r['moved_fraction'] <= 0.10 for r in small)} (in "
               f"{sum(r['moved_fraction'] <= 0.10 or r['floor_fraction'] > 0.10 for r in small)} counting those "
               f"whose floor is above 10%); worst moved "
               f"{max((r['moved_fraction'] for r in small), default=0):.2%}; worst cp/fresh "
               f"{max(r['critical_path_ratio'] for r in results):.4f} (target <= 1.02)")
    return table + summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", metavar="WORKLOAD")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "replan_bench.json")
    args = parser.parse_args(argv)
    results = []
    for w in WORKLOADS:
        if args.only and w.name not in args.only:
            continue
        results += bench(w, args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "results": results}, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
