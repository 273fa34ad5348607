"""The per-rank table of a plan, as rows of text: the CLI prints it aligned, the Prefect artifact as
markdown. It marks the critical rank, shows the memory that binds (HBM on cuda, DDR on cpu, and DDR
on cuda when tables live there), and beyond ``SUMMARY_ABOVE`` ranks summarizes: min, median and max
of every column, then the ``TOP`` busiest ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rec.plan.types import Plan
from rec.sharding import ComputeDevice
from rec.units import format_bytes

SUMMARY_ABOVE = 32
TOP = 5
CRITICAL = "<- critical path"


@dataclass(frozen=True)
class RankTable:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: tuple[str, ...]  # right-aligned (numeric) columns
    note: str  # what the rows are, when not every rank


def shards_per_rank(plan: Plan) -> np.ndarray:
    """Shards on each rank (a data_parallel table has one on every rank)."""
    c = plan.columns
    replica = np.repeat(c.replicated, np.diff(c.shard_start))  # per entry
    counts: np.ndarray = np.bincount(c.rank[~replica], minlength=plan.world_size)
    return counts + int(c.replicated.sum())


def sharding_types(plan: Plan) -> dict[str, int]:
    """Tables per sharding type, e.g. ``{"table_wise": 349, "data_parallel": 151}``."""
    from rec.sharding import SHARDING_TYPES

    counts = np.bincount(plan.columns.sharding_type, minlength=len(SHARDING_TYPES))
    return {st.value: int(n) for st, n in zip(SHARDING_TYPES, counts, strict=True) if n}


def rank_table(plan: Plan, all_ranks: bool = False) -> RankTable:
    """Every rank (up to ``SUMMARY_ABOVE``, or with ``all_ranks``), else the summary rows."""
    m = plan.metrics
    world = plan.world_size
    perf = np.asarray(m.rank_perf, dtype=float)
    hbm, hbm_cap = np.asarray(m.rank_hbm), np.asarray(m.rank_hbm_cap)
    ddr, ddr_cap = np.asarray(m.rank_ddr), np.asarray(m.rank_ddr_cap)
    cuda = plan.topology.compute_device is ComputeDevice.CUDA
    columns: dict[str, tuple[np.ndarray, str]] = {"perf_ms": (perf, "ms")}
    # Usable capacity: HBM after the storage reservation (what the search fills up to).
    if cuda:
        columns.update(hbm=(hbm, "bytes"), hbm_usable=(hbm_cap, "bytes"), hbm_used=(_share(hbm, hbm_cap), "%"))
    if not cuda or ddr.any():
        columns.update(ddr=(ddr, "bytes"), ddr_usable=(ddr_cap, "bytes"), ddr_used=(_share(ddr, ddr_cap), "%"))
    columns.update(shards=(shards_per_rank(plan), "count"), rows=(np.asarray(plan.rows_per_rank()), "count"))
    critical = int(np.argmax(perf)) if world else -1

    def row(label: str, values: dict[str, float], mark: str = "") -> tuple[str, ...]:
        return (label, *(_fmt(values[name], unit) for name, (_, unit) in columns.items()), mark)

    def rank_row(r: int) -> tuple[str, ...]:
        return row(str(r), {name: v[r] for name, (v, _) in columns.items()}, CRITICAL if r == critical else "")

    header = ("rank", *columns, "")
    right = ("rank", *columns)
    if all_ranks or world <= SUMMARY_ABOVE:
        return RankTable(header, tuple(rank_row(r) for r in range(world)), right, "")
    stats = [row(label, {name: float(fn(v)) for name, (v, _) in columns.items()})
             for label, fn in (("min", np.min), ("median", np.median), ("max", np.max))]
    busiest = np.argsort(-perf, kind="stable")[:TOP]
    gap = tuple("" for _ in header)
    note = (f"{world:,} ranks: min, median and max of each column, then the {TOP} busiest ranks "
            "(--all-ranks for every rank)")
    return RankTable(header, (*stats, gap, *(rank_row(int(r)) for r in busiest)), right, note)


def _share(used: np.ndarray, cap: np.ndarray) -> np.ndarray:
    share: np.ndarray = np.divide(used, cap, out=np.zeros(len(used)), where=cap > 0)
    return share


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.4f}"
    if unit == "bytes":
        return format_bytes(value)
    if unit == "%":
        return "<0.1%" if 0 < value < 0.001 else f"{value:.1%}"
    return f"{round(value):,}"


def markdown(table: RankTable) -> str:
    """The table in markdown (the Prefect UI renders it)."""
    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(cells) + " |"

    rule = tuple("---:" if h in table.right else "---" for h in table.header)
    body = [line(r) for r in table.rows if any(r)]
    return "\n".join([line(table.header), line(rule), *body] + ([f"\n{table.note}"] if table.note else []))
