"""The search space: candidate options, their aggregate costs and the ranks' capacities.

Options arrive run-length encoded (``rec.cost.types.Options``): an *entry* stands for ``repeat``
consecutive shards of equal cost. Free-placed shards (table_wise, column_wise, table_column_wise)
are always single entries; fixed-placed runs (data_parallel, row_wise, table_row_wise) cover
consecutive ranks starting at the run's position, so the search never expands them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rec.cost.types import Options
from rec.search.placement import Placement, placement_codes


@dataclass(frozen=True)
class SearchSpace:
    """Everything the search reads; immutable and cheap to ship to a Ray actor."""

    options: Options
    num_tables: int
    world_size: int
    local_world_size: int
    hbm_cap: np.ndarray  # (W,) bytes usable per rank after the storage reservation
    ddr_cap: np.ndarray  # (W,)
    work: np.ndarray  # (O,) sum of shard perf: what the option adds to all ranks together
    max_shard: np.ndarray  # (O,) largest single shard perf of the option
    placement: np.ndarray  # (O,) placement code
    feasible: np.ndarray  # (O,) bool: every shard fits on a rank it may go to
    entry_owner: np.ndarray  # (E,) option of each entry
    entry_position: np.ndarray  # (E,) index of the entry's first shard within its option
    # (T,) the cache sizes the options were costed with where a plan chose them (NaN: the spec's or
    # the cost model's); None: none chosen
    chosen_load_factor: np.ndarray | None = None
    # (T,) the caches the options were costed as given no size where a plan's placement decided them
    # (rec.cost.tables.CacheRule.PLACED); None: as before tables are placed
    unstated: np.ndarray | None = None

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size


def entry_layout(options: Options) -> tuple[np.ndarray, np.ndarray]:
    """Owner option and first-shard position of every entry."""
    owner = np.repeat(np.arange(options.num_options), options.num_entries())
    totals = np.concatenate((np.zeros(1, np.int64), np.cumsum(options.repeat, dtype=np.int64)))
    position = totals[:-1] - totals[options.shard_start[owner]]
    return owner, position


def build_space(options: Options, num_tables: int, world_size: int, local_world_size: int,
                hbm_cap: np.ndarray, ddr_cap: np.ndarray) -> SearchSpace:
    """Aggregate per-option costs and mark options whose shards cannot fit anywhere."""
    work = options.total(options.perf)
    max_shard = options.largest(options.perf)
    placement = placement_codes(options.sharding_type)
    owner, position = entry_layout(options)
    hbm_cap = np.asarray(hbm_cap, dtype=np.int64)
    ddr_cap = np.asarray(ddr_cap, dtype=np.int64)
    feasible = _feasible(options, placement[owner], owner, hbm_cap, ddr_cap)
    return SearchSpace(options, num_tables, world_size, local_world_size, hbm_cap, ddr_cap,
                       work, max_shard, placement, feasible, owner, position)


def _feasible(options: Options, entry_placement: np.ndarray, owner: np.ndarray,
              hbm_cap: np.ndarray, ddr_cap: np.ndarray) -> np.ndarray:
    # A fixed-position run must fit the smallest rank it may cover; a free shard the largest.
    fixed = (entry_placement == Placement.EVERY_RANK) | (entry_placement == Placement.HOST_UNIFORM)
    hbm_limit = np.where(fixed, hbm_cap.min(), hbm_cap.max())
    ddr_limit = np.where(fixed, ddr_cap.min(), ddr_cap.max())
    fits = (options.hbm <= hbm_limit) & (options.ddr <= ddr_limit)
    bad = np.bincount(owner[~fits], minlength=options.num_options)
    return np.asarray(bad == 0)


def run_ranks(space: SearchSpace, entries: np.ndarray, first_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expand runs to (entry, rank) pairs: entry e covers ranks first_rank..first_rank+repeat-1."""
    rep = space.options.repeat[entries].astype(np.int64)
    idx = np.repeat(np.arange(len(entries)), rep)
    k = np.arange(len(idx)) - np.repeat(np.cumsum(rep) - rep, rep)
    return entries[idx], first_rank[idx] + k


def add_runs(space: SearchSpace, values: np.ndarray, first_rank: np.ndarray,
             repeat: np.ndarray) -> np.ndarray:
    """Per-rank sum of ``values`` added to every rank of each run (difference array: O(E + W))."""
    w = space.world_size
    diff = np.bincount(first_rank, weights=values, minlength=w + 1)
    diff -= np.bincount(first_rank + repeat, weights=values, minlength=w + 1)
    return np.cumsum(diff)[:w]


def table_starts(space: SearchSpace) -> np.ndarray:
    """Index of each table's first option, for per-table ``reduceat``. Options come grouped by
    table (the enumerator's order, kept by group subspaces) and a searched table has at least one
    (``check_every_table_fits``); anything else is a bug."""
    table = space.options.table
    starts = np.searchsorted(table, np.arange(space.num_tables))
    stops = np.append(starts[1:], len(table))
    if (np.diff(table) < 0).any() or not (stops > starts).all():
        raise ValueError("options must be grouped by table, with at least one per table")
    return starts


def without_options(space: SearchSpace, banned: np.ndarray) -> SearchSpace | None:
    """``space`` with the ``banned`` options (O,) infeasible; None if a table would have none left."""
    feasible = space.feasible & ~banned
    covered = np.zeros(space.num_tables, dtype=bool)
    np.logical_or.at(covered, space.options.table, feasible)
    return replace(space, feasible=feasible) if covered.all() else None
