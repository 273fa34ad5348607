"""Choose one option per table: the least total work among options whose largest shard is small
enough, so that packing can balance the ranks."""

from __future__ import annotations

import numpy as np

from rec.search.space import SearchSpace, table_starts


def first_min_per_table(space: SearchSpace, score: np.ndarray) -> np.ndarray:
    """Index of the lowest-scoring option of each table (lowest index on ties)."""
    table = space.options.table
    best = np.minimum.reduceat(score, table_starts(space))
    hits = np.flatnonzero(score == best[table])
    first = hits[np.concatenate(([True], table[hits[1:]] != table[hits[:-1]]))]
    choice = np.empty(space.num_tables, dtype=np.int64)
    choice[table[first]] = first
    return choice


def select_options(space: SearchSpace, max_shard_limit: float,
                   cost: np.ndarray | None = None, allowed: np.ndarray | None = None) -> np.ndarray:
    """Per table, the least-``cost`` feasible (and ``allowed``, where the table has such an
    option) option whose largest shard is within the limit; tables with no such option take the
    option with the smallest largest shard."""
    cost = space.work if cost is None else cost
    if allowed is not None:
        has_allowed = np.zeros(space.num_tables, dtype=bool)
        has_allowed[space.options.table[allowed & space.feasible]] = True
        cost = np.where(allowed | ~has_allowed[space.options.table], cost, np.inf)
    within = space.feasible & (space.max_shard <= max_shard_limit) & np.isfinite(cost)
    choice = first_min_per_table(space, np.where(within, cost, np.inf))
    has_within = np.zeros(space.num_tables, dtype=bool)
    has_within[space.options.table[within]] = True
    if not has_within.all():
        smallest = first_min_per_table(space, np.where(space.feasible, space.max_shard, np.inf))
        choice[~has_within] = smallest[~has_within]
    return choice


def shard_limits(space: SearchSpace, least: float, count: int) -> list[float]:
    """Candidate largest-shard limits, geometric from the bound to the unconstrained choice."""
    unconstrained = select_options(space, np.inf)
    top = float(space.max_shard[unconstrained].max()) if len(unconstrained) else 0.0
    if top <= least or least <= 0:
        return [np.inf]
    ladder = np.geomspace(least, top, count)
    return [float(x) for x in ladder] + [np.inf]
