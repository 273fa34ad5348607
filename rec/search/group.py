"""Split the tables into groups of similar cost and rate the candidates on one group alone.

Groups are what Ray actors search in parallel (``tasks.ray_search``). Every group builds the same
candidates (same families, same largest-shard limits) for its own tables and packs each on top of
a background load standing for the other groups, which rates the candidates; ``rec.search.merge``
assembles the global candidates, packs the best-rated ones on all ranks and refines them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rec.cost.types import Options
from rec.search.assignment import Assignment
from rec.search.bound import per_table_min
from rec.search.candidates import Ladder, candidates, pack_candidate
from rec.search.pack import PackingError
from rec.search.pricing import Prices
from rec.search.space import SearchSpace, entry_layout


@dataclass(frozen=True)
class GroupResult:
    """A group's candidate choices (parent option indices) and how well each packed."""

    tables: np.ndarray  # (k,) table indices in the parent space
    families: np.ndarray  # (C,) family (``Family`` value) of each candidate
    choices: np.ndarray  # (C, k) option per table and candidate, in the parent's option indices
    packed: np.ndarray  # (C,) critical path of the group over its background; inf: did not fit
    prices: tuple[Prices, ...] = ()  # (C,) memory prices of each candidate (priced ones)


def split_groups(space: SearchSpace, groups: int) -> list[np.ndarray]:
    """Deal tables into ``groups`` groups of nearly equal least work (largest first)."""
    groups = max(1, min(groups, space.num_tables))
    work = per_table_min(space, space.work)
    order = np.lexsort((np.arange(space.num_tables), -work))
    # Snake order (0..g-1, g-1..0, ...) balances like LPT for many tables, without a heap.
    lane = np.arange(len(order)) % (2 * groups)
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


def background(space: SearchSpace, sub: SearchSpace, tables: np.ndarray) -> Assignment:
    """The other groups as an even load and memory use on every rank."""
    least_work = per_table_min(space, space.work)
    load = (least_work.sum() - least_work[tables].sum()) / space.world_size
    total_hbm = space.options.total(space.options.hbm).astype(float)
    need = per_table_min(space, total_hbm)
    other_hbm = (need.sum() - need[tables].sum()) / space.world_size
    return Assignment(
        choice=np.zeros(len(tables), np.int64),
        shard_rank=np.full(len(sub.options.perf), -1, np.int32),
        loads=np.full(space.world_size, load),
        hbm=np.minimum(np.full(space.world_size, int(other_hbm)), space.hbm_cap).astype(np.int64),
        ddr=np.zeros(space.world_size, np.int64),
    )


def search_group(space: SearchSpace, tables: np.ndarray, ladder: Ladder) -> GroupResult:
    """Build and rate the candidates of one group (``ladder``: the global one)."""
    sub, parent_option = subspace(space, tables)
    start = background(space, sub, tables)
    cands = candidates(sub, ladder)
    packed = np.full(len(cands), np.inf)
    rated: dict[bytes, float] = {}  # a group's selections often coincide (e.g. no shard is big)
    for i, c in enumerate(cands):
        key = c.choice.tobytes()
        if key not in rated:
            try:
                rated[key] = pack_candidate(sub, c, start).critical_path
            except PackingError:
                rated[key] = np.inf
        packed[i] = rated[key]
    return GroupResult(tables, np.array([c.family.value for c in cands]),
                       parent_option[np.stack([c.choice for c in cands])], packed,
                       tuple(c.prices for c in cands))
