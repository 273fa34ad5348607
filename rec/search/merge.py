"""Merge the groups into one plan for all ranks: assemble the global candidates, pack the ones
the groups rated best, refine and polish."""

from __future__ import annotations

import numpy as np

from rec.config.search import SearchConfig
from rec.search.assignment import Assignment
from rec.search.bound import LowerBound
from rec.search.candidates import Candidate, Family
from rec.search.group import GroupResult
from rec.search.heuristic import best_polished
from rec.search.space import SearchSpace


def merge_groups(space: SearchSpace, groups: list[GroupResult], bound: LowerBound,
                 config: SearchConfig = SearchConfig()) -> Assignment:
    """One assignment for every table from the groups' candidates (``bound``: all tables')."""
    count = len(groups[0].packed)
    choice = np.full((count, space.num_tables), -1, dtype=np.int64)
    for g in groups:
        choice[:, g.tables] = g.choices
    if (choice < 0).any():
        raise ValueError("the groups leave tables without a choice")
    # A candidate is as good as its worst group.
    ranking = np.max([g.packed for g in groups], axis=0)
    cands = [Candidate(Family(f), choice[i], p)
             for i, (f, p) in enumerate(zip(groups[0].families, groups[0].prices, strict=True))]
    return best_polished(space, cands, config, bound, ranking)
