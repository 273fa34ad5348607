"""``shardflow show PLAN [--table NAME] [--rank R]``: which tables sit where, and what each rank's
estimated time is made of.

Without options: one row per rank (a summary beyond 32 ranks, ``--all-ranks`` for all) with its
estimated time split into compute and communication, its table count and its costliest tables.
``--table NAME`` (a name or a pattern such as ``'user*'``; a table outside the default module is
``module.name``, as everywhere in a plan): each shard of the matching tables and its rank.
``--rank R``: the shards on rank R, costliest
first (the first 20; ``--all`` for every one). Times come from the plan's own cost model
(TorchRec's); communication is what the network's speed decides.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rec.exit_codes import ExitCode
from rec.settings import add_flags

if TYPE_CHECKING:
    from rec.plan import Plan
    from rec.plan.breakdown import Breakdown

TOP_TABLES = 3  # costliest tables named per rank
SUMMARY_ROWS = 20  # shards `--rank` lists without --all


def memory_columns(plan: Plan, parts: Breakdown) -> tuple[str, ...]:
    """hbm on cuda, ddr on cpu (and on cuda when tables live there)."""
    cuda = plan.topology.compute_device == "cuda"
    return (("hbm",) if cuda else ()) + (("ddr",) if not cuda or parts.ddr.any() else ())


def memory_cells(parts: Breakdown, e: int, columns: tuple[str, ...]) -> tuple[str, ...]:
    from rec.units import format_bytes

    return tuple(format_bytes(getattr(parts, c)[e]) for c in columns)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from flows.commands.plan import ReportSettings

    p = subparsers.add_parser("show", help="which tables sit on which rank; compute and communication per rank",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", metavar="PLAN", help="plan.json or its directory")
    p.add_argument("--table", metavar="NAME", help="the shards of this table (or of tables matching a pattern; "
                   "module.name for a table outside the default module)")
    p.add_argument("--rank", type=int, metavar="R", help="the shards on rank R, costliest first")
    p.add_argument("--all", action="store_true",
                   help=f"with --rank: every shard (default: the {SUMMARY_ROWS} costliest)")
    add_flags(p, ReportSettings)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import fnmatch

    from rec.analysis import check_plan
    from rec.errors import InputError, Problem
    from rec.plan import read_plan
    from rec.plan.breakdown import breakdown

    if args.all and args.rank is None:
        raise InputError("Cannot show this plan:", [Problem("--all", "lists every shard of one rank: give it with "
                                                                     "--rank R (--all-ranks lists every rank)")])
    plan = read_plan(args.plan)
    check_plan(plan, source=f"the plan {args.plan}")  # what it shows must be what its shards give
    if args.rank is not None and not 0 <= args.rank < plan.world_size:
        raise InputError("Cannot show this rank:", [Problem(f"--rank {args.rank}", f"plan {plan.plan_id} has "
                                                             f"ranks 0 to {plan.world_size - 1}")])
    names = [t.key for t in plan.tables]  # `module.name` outside the default module
    chosen = [i for i, n in enumerate(names) if fnmatch.fnmatchcase(n, args.table)] if args.table else []
    if args.table and not chosen:
        inside = [n for n in names if "." in n and fnmatch.fnmatchcase(n.rsplit(".", 1)[1], args.table)]
        hint = f"; a table outside the default module is module.name, e.g. {inside[0]!r}" if inside else ""
        raise InputError("Cannot show this table:", [Problem(f"--table {args.table}", f"no table of plan "
                                                              f"{plan.plan_id} matches{hint}")])
    parts = breakdown(plan)
    if args.table:
        print(render_tables(plan, parts, chosen))
    if args.rank is not None:
        print(("\n" if args.table else "") + render_rank(plan, parts, args.rank, None if args.all else SUMMARY_ROWS))
    if not args.table and args.rank is None:
        print(render_ranks(plan, parts, args.all_ranks))
    return ExitCode.OK


def render_ranks(plan: Plan, parts: Breakdown, all_ranks: bool) -> str:
    import numpy as np

    from flows.reports import cache_lines
    from rec.plan.report import CRITICAL, SUMMARY_ABOVE, TOP
    from rec.text_table import render_table

    compute, comm = parts.rank_compute(), parts.rank_comm()
    total = compute + comm
    critical = int(np.argmax(plan.metrics.rank_perf))
    placed = parts.rank >= 0
    tables = np.zeros(plan.world_size, dtype=np.int64)
    np.add.at(tables, parts.rank[placed], 1)  # shards; a rank holds one shard of most tables
    tables += int((~placed).sum())
    cost = parts.compute_ms + parts.comm_ms

    def costliest(r: int) -> str:
        on = parts.on_rank(r)
        top = on[np.argsort(-cost[on], kind="stable")[:TOP_TABLES]]
        return ", ".join(f"{plan.tables[parts.table[e]].key} {cost[e]:.3f}" for e in top)

    def row(r: int) -> tuple[object, ...]:
        return (r, f"{total[r]:.4f}", f"{compute[r]:.4f}", f"{comm[r]:.4f}", f"{comm[r] / total[r]:.0%}"
                if total[r] else "-", f"{tables[r]:,}", costliest(r), CRITICAL if r == critical else "")

    ranks = list(range(plan.world_size))
    note = ""
    if plan.world_size > SUMMARY_ABOVE and not all_ranks:
        ranks = [int(r) for r in np.argsort(-total, kind="stable")[:TOP]]
        note = (f"\nthe {TOP} busiest of {plan.world_size:,} ranks; compute {compute.min():.4f}-"
                f"{compute.max():.4f} ms, communication {comm.min():.4f}-{comm.max():.4f} ms over all ranks "
                "(--all-ranks for every rank)")
    header = ("rank", "perf_ms", "compute_ms", "comm_ms", "comm", "shards", "costliest (ms)", "")
    caches = "".join(f"\n{line}" for line in cache_lines(plan))
    return (render_table(header, [row(r) for r in ranks], right=("rank", "perf_ms", "compute_ms", "comm_ms",
                                                                   "comm", "shards"))
            + note + f"\n\nplan {plan.plan_id}: {len(plan.tables):,} tables on {plan.world_size:,} ranks; "
                     f"critical path {plan.metrics.critical_path:.4f} ms on rank {critical}{caches}")


def render_tables(plan: Plan, parts: Breakdown, chosen: list[int]) -> str:
    import numpy as np

    from rec.text_table import render_table
    from rec.units import format_bytes

    memory = memory_columns(plan, parts)
    blocks = []
    for ti in chosen:
        t = plan.tables[ti]
        first, stop = np.searchsorted(parts.table, [ti, ti + 1])  # entries are in table order
        entries = range(int(first), int(stop))
        title = f"table {t.key}: {t.sharding_type.value}, {t.compute_kernel.value}, {t.perf:.4f} ms in all"
        if t.replicated:
            e = entries[0]
            blocks.append(f"{title}\n  a replica on each of the {plan.world_size:,} ranks: compute "
                          f"{parts.compute_ms[e]:.4f} ms, communication {parts.comm_ms[e]:.4f} ms, "
                          f"{format_bytes(parts.hbm[e] or parts.ddr[e])} each")
            continue
        rows = []
        for e in entries:
            s = t.shards[int(parts.shard[e])]
            rows.append((int(parts.shard[e]), s.rank, f"{s.offsets[0]:,}:{s.offsets[0] + s.sizes[0]:,}",
                         f"{s.offsets[1]}:{s.offsets[1] + s.sizes[1]}", f"{parts.compute_ms[e]:.4f}",
                         f"{parts.comm_ms[e]:.4f}", *memory_cells(parts, e, memory)))
        header = ("shard", "rank", "rows", "cols", "compute_ms", "comm_ms", *memory)
        blocks.append(title + "\n" + render_table(header, rows, right=header))
    return "\n\n".join(blocks)


def render_rank(plan: Plan, parts: Breakdown, rank: int, limit: int | None = None) -> str:
    """The shards on ``rank``, costliest first (the first ``limit``), and the rank's totals."""
    import numpy as np

    from flows.commands.spec import more_rows
    from rec.text_table import render_table

    on = parts.on_rank(rank)
    cost = parts.compute_ms[on] + parts.comm_ms[on]
    memory = memory_columns(plan, parts)
    rows = []
    for e in on[np.argsort(-cost, kind="stable")]:
        t = plan.tables[parts.table[e]]
        shard = "replica" if parts.rank[e] < 0 else f"{int(parts.shard[e]) + 1} of {len(t.shards)}"
        rows.append((t.key, t.sharding_type.value, t.compute_kernel.value, shard,
                     f"{parts.compute_ms[e] + parts.comm_ms[e]:.4f}", f"{parts.compute_ms[e]:.4f}",
                     f"{parts.comm_ms[e]:.4f}", *memory_cells(parts, e, memory)))
    compute, comm = float(parts.compute_ms[on].sum()), float(parts.comm_ms[on].sum())
    header = ("table", "sharding_type", "kernel", "shard", "perf_ms", "compute_ms", "comm_ms", *memory)
    return (render_table(header, rows[:limit], right=("perf_ms", "compute_ms", "comm_ms", *memory))
            + more_rows(len(rows), limit)
            + f"\n\nrank {rank}: {len(rows):,} shards, {compute + comm:.4f} ms = compute {compute:.4f} ms "
              f"+ communication {comm:.4f} ms")
