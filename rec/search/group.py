"""Split the tables into groups of similar cost and search one group on its own.

Groups are what Ray actors search in parallel (``tasks.ray_search``); ``rec.search.merge``
combines their choices into one plan for all ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rec.cost.types import Options
from rec.search.assignment import Assignment
from rec.search.bound import per_table_min
from rec.search.config import SearchConfig
from rec.search.planner import search
from rec.search.space import SearchSpace, entry_layout


@dataclass(frozen=True)
class GroupResult:
    """A group's chosen option per table, in the parent space's option indices."""

    tables: np.ndarray  # (k,) table indices in the parent space
    choice: np.ndarray  # (k,) option indices in the parent space
    critical_path: float  # of the group alone, on top of its background load


def split_groups(space: SearchSpace, groups: int) -> list[np.ndarray]:
    """Deal tables into ``groups`` groups of nearly equal least work (largest first)."""
    groups = max(1, min(groups, space.num_tables))
    work = per_table_min(space, space.work)
    order = np.lexsort((np.arange(space.num_tables), -work))
    # Snake order (0..g-1, g-1..0, ...) balances like LPT for many tables, without a heap.
    n = len(order)
    lane = np.arange(n) % (2 * groups)
    lane = np.where(lane < groups, lane, 2 * groups - 1 - lane)
    return [np.sort(order[lane == g]) for g in range(groups)]


def subspace(space: SearchSpace, tables: np.ndarray) -> tuple[SearchSpace, np.ndarray]:
    """The search space of ``tables`` alone (tables renumbered 0..k-1) and the parent index of
    each of its options."""
    opts = space.options
    keep = np.flatnonzero(np.isin(opts.table, tables))
    renumber = np.full(space.num_tables, -1, dtype=np.int32)
    renumber[tables] = np.arange(len(tables), dtype=np.int32)
    starts, stops = opts.shard_start[keep], opts.shard_start[keep + 1]
    counts = stops - starts
    shard_index = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts) + \
        np.arange(counts.sum())
    sub = Options(
        table=renumber[opts.table[keep]],
        sharding_type=opts.sharding_type[keep],
        compute_kernel=opts.compute_kernel[keep],
        shard_start=np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
        **{name: getattr(opts, name)[shard_index]
           for name in ("perf", "hbm", "ddr", "row_offset", "col_offset", "rows", "cols",
                        "repeat", "row_step")},
    )
    owner, position = entry_layout(sub)
    return replace(space, options=sub, num_tables=len(tables), work=space.work[keep],
                   max_shard=space.max_shard[keep], placement=space.placement[keep],
                   feasible=space.feasible[keep], entry_owner=owner,
                   entry_position=position), keep


def search_group(space: SearchSpace, tables: np.ndarray, config: SearchConfig,
                 global_bound: float) -> GroupResult:
    """Choose options for one group as if the rest of the tables were already spread evenly.

    The group packs on top of a uniform background load and memory use for everything else,
    so its choices are made at the load level of the full plan."""
    sub, parent_option = subspace(space, tables)
    least_work = per_table_min(space, space.work)
    background = (least_work.sum() - least_work[tables].sum()) / space.world_size
    share = 1.0 - len(tables) / max(space.num_tables, 1)
    start = Assignment(
        choice=np.zeros(len(tables), np.int64),
        shard_rank=np.full(len(sub.options.perf), -1, np.int32),
        loads=np.full(space.world_size, background),
        hbm=(space.hbm_cap * share * _memory_pressure(space)).astype(np.int64),
        ddr=np.zeros(space.world_size, np.int64),
    )
    a = search(sub, config, start=start, ladder_bound=global_bound)
    return GroupResult(tables, parent_option[a.choice], a.critical_path)


def _memory_pressure(space: SearchSpace) -> float:
    """Fraction of HBM the smallest-HBM choice of every table would fill."""
    total_hbm = np.add.reduceat(space.options.hbm, space.options.shard_start[:-1]).astype(float)
    need = per_table_min(space, total_hbm).sum()
    return float(min(1.0, need / max(space.hbm_cap.sum(), 1)))
