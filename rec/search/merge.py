"""Merge the groups' choices into one plan for all ranks: pack globally, then refine."""

from __future__ import annotations

import numpy as np

from rec.search.assignment import Assignment
from rec.search.config import SearchConfig
from rec.search.group import GroupResult
from rec.search.pack import PackingError, PackOrder, pack
from rec.search.refine import refine
from rec.search.space import SearchSpace


def merge_groups(space: SearchSpace, groups: list[GroupResult],
                 config: SearchConfig = SearchConfig()) -> Assignment:
    """One assignment for every table from the per-group option choices."""
    choice = np.full(space.num_tables, -1, dtype=np.int64)
    for g in groups:
        choice[g.tables] = g.choice
    if (choice < 0).any():
        raise ValueError(f"groups leave {int((choice < 0).sum())} tables without a choice")
    failure = PackingError([])
    for order in PackOrder:
        try:
            a = pack(space, choice, order)
        except PackingError as e:
            failure = e
            continue
        return refine(space, a, config.refine_rounds)
    raise failure
