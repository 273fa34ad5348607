"""``shardflow plan SPEC --topology TOPO --out DIR``: search a sharding plan and write it.

The same three steps as the Prefect ``plan`` flow (ingest, search, write: plan.json,
shards.parquet, rank_load.png), without Prefect or MLflow; ``shardflow run --plan-only`` runs them
as the flow, with the plan cache and an MLflow plan run.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import TYPE_CHECKING

from rec.settings import add_flags

if TYPE_CHECKING:
    from rec.plan import Plan


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from tasks.search import SearchSettings
    from tasks.write import WriteSettings

    parser = subparsers.add_parser("plan", help="search a sharding plan and write plan.json",
                                   description=__doc__)
    add_input_arguments(parser)
    parser.add_argument("--out", metavar="DIR", required=True,
                        help="where plan.json, shards.parquet and rank_load.png go")
    add_flags(parser.add_argument_group("search"), SearchSettings)
    add_flags(parser.add_argument_group("artifact"), WriteSettings)
    parser.set_defaults(handler=run)


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """SPEC and --topology, for every command that plans."""
    parser.add_argument("spec", metavar="SPEC", help="table spec: .parquet .arrow .feather .csv .yaml .json")
    parser.add_argument("--topology", metavar="TOPO", required=True, help="topology YAML")


def run(args: argparse.Namespace) -> int:
    from rec.settings import check, from_flags
    from tasks.ingest import ingest
    from tasks.search import SearchSettings, search_plan
    from tasks.write import WriteSettings, write_plan_artifact

    searching = from_flags(SearchSettings, args)
    check(searching, "Cannot plan with these settings:")
    inputs = ingest(args.spec, args.topology)
    found = search_plan(inputs, searching)
    written = write_plan_artifact(found.plan, args.out, from_flags(WriteSettings, args))
    print(render_plan(found.plan, found.seconds))
    print(f"\nwrote {', '.join(written.files)}")
    return 0


def render_plan(plan: Plan, planning_s: float) -> str:
    """Per-rank load and memory, then the plan's quality against the lower bound."""
    from flows.text_table import render_table
    from rec.units import format_bytes

    m = plan.metrics
    world = len(m.rank_perf)
    shards = Counter(s.rank for t in plan.tables for s in t.shards)
    rows = plan.rows_per_rank()
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
        f"lower bound:   {m.lower_bound:.4f} ms  gap {100 * m.gap:.2f}% ({m.bound_method} bound"
        f"{'; proven optimal' if m.optimal else ''})\n"
        f"planning time: {planning_s:.3f} s\n"
        f"plan_id:       {plan.plan_id}  spec_hash {plan.spec_hash}"
    )
