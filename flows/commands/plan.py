"""``shardflow plan SPEC --topology TOPO --out DIR``: search a sharding plan and write it."""

from __future__ import annotations

import argparse
from collections import Counter

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rec.plan import Plan


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="search a sharding plan and write plan.json",
                                   description=__doc__)
    parser.add_argument("spec", metavar="SPEC", help="table spec: .parquet .arrow .feather .csv .yaml .json")
    parser.add_argument("--topology", metavar="TOPO", required=True, help="topology YAML")
    parser.add_argument("--out", metavar="DIR", required=True, help="where plan.json and shards.parquet go")
    parser.add_argument("--backend", choices=("local", "ray", "auto"), default="local",
                        help="search in this process, on Ray actors, or pick by spec size (default: local)")
    parser.add_argument("--groups", type=int, default=None,
                        help="table groups for the Ray backend (default: from table count and CPUs)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rec.plan import write_plan
    from rec.planning import plan_spec
    from rec.spec import read_spec
    from rec.topology import read_topology

    spec = read_spec(args.spec)
    topology = read_topology(args.topology)
    searcher = None
    if args.backend != "local":
        from tasks.ray_search import searcher_for_backend

        searcher = searcher_for_backend(args.backend, len(spec), args.groups)
    plan = plan_spec(spec, topology, searcher=searcher)
    path = write_plan(plan, args.out)
    print(render_plan(plan))
    print(f"\nwrote {path} and {path.parent / 'shards.parquet'}")
    return 0


def render_plan(plan: "Plan") -> str:
    """Per-rank load and memory, then the plan's quality against the lower bound."""
    from flows.text_table import render_table
    from rec.plan import rows_per_rank
    from rec.units import format_bytes

    m = plan.metrics
    world = len(m.rank_perf)
    shards = Counter(s.rank for t in plan.tables for s in t.shards)
    rows = rows_per_rank(plan, world)
    table = render_table(
        ("rank", "perf_ms", "hbm", "hbm_cap", "ddr", "shards", "rows"),
        [(r, f"{m.rank_perf[r]:.4f}", format_bytes(m.rank_hbm[r]), format_bytes(m.rank_hbm_cap[r]),
          format_bytes(m.rank_ddr[r]), shards[r], f"{rows[r]:,}") for r in range(world)],
        right=("rank", "perf_ms", "hbm", "hbm_cap", "ddr", "shards", "rows"),
    )
    kinds = Counter(t.sharding_type.value for t in plan.tables)
    kinds_text = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    return (
        f"{table}\n\n"
        f"tables:        {len(plan.tables)} ({kinds_text})\n"
        f"critical path: {m.critical_path:.4f} ms (TorchRec cost model)\n"
        f"lower bound:   {m.lower_bound:.4f} ms  gap {100 * m.gap:.2f}%\n"
        f"planning time: {m.planning_s:.3f} s\n"
        f"plan_id:       {plan.plan_id}  spec_hash {plan.spec_hash}"
    )
