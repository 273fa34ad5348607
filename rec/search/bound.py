"""A provable lower bound on the critical path of any plan over the same options."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rec.search.space import SearchSpace, table_starts


@dataclass(frozen=True)
class LowerBound:
    value: float
    average_work: float  # least total work of all tables / world size
    largest_shard: float  # the largest shard some table cannot avoid


def per_table_min(space: SearchSpace, values: np.ndarray) -> np.ndarray:
    """For each table, the least of ``values`` over its feasible options (inf if none)."""
    return np.minimum.reduceat(np.where(space.feasible, values, np.inf), table_starts(space)).astype(float)


def lower_bound(space: SearchSpace) -> LowerBound:
    """Every table adds at least its least work and some rank carries its least-max shard."""
    least_work = per_table_min(space, space.work)
    least_max = per_table_min(space, space.max_shard)
    average = float(least_work.sum() / space.world_size) if len(least_work) else 0.0
    largest = float(least_max.max()) if len(least_max) else 0.0
    return LowerBound(max(average, largest), average, largest)
