"""Candidate selections: one option per table for each (family, largest-shard limit).

Selection is per table, so a candidate restricted to a group of tables is that group's own
candidate for the same family and limit: groups searched apart line up index by index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rec.search.assignment import Assignment
from rec.search.pack import PackingError, PackOrder, pack
from rec.search.placement import FREE, HOST_FREE
from rec.search.refine import refine
from rec.search.select import select_options
from rec.search.space import SearchSpace

ANY, WHOLE = 0, 1  # families: any option / whole shards placed freely (no replicas, no row splits)


@dataclass(frozen=True)
class Candidate:
    family: int
    choice: np.ndarray  # (T,) option per table


def candidates(space: SearchSpace, limits: list[float]) -> list[Candidate]:
    """Least-work options under each limit, for both families, plus the least-memory choice.

    With few tables, whole shards placed freely can balance better than options that load every
    rank (replicas, row splits), even at more total work."""
    whole = (space.placement == FREE) | (space.placement == HOST_FREE)
    out = [Candidate(ANY, select_options(space, limit)) for limit in limits]
    total_hbm = np.add.reduceat(space.options.hbm * space.options.repeat,
                                space.options.shard_start[:-1]).astype(float)
    out.append(Candidate(ANY, select_options(space, np.inf, cost=total_hbm)))
    out += [Candidate(WHOLE, select_options(space, limit, allowed=whole)) for limit in limits]
    return out


def pack_any_order(space: SearchSpace, choice: np.ndarray, start: Assignment | None = None) -> Assignment:
    """Pack by time; if memory does not allow it, by size."""
    failure = PackingError([])
    for order in PackOrder:
        try:
            return pack(space, choice, order, start=None if start is None else start.copy())
        except PackingError as e:
            failure = e
    raise failure


def best_of(space: SearchSpace, cands: list[Candidate], refine_top: int, refine_rounds: int,
            good_enough: float = 0.0, ranking: np.ndarray | None = None) -> Assignment:
    """Pack candidates and refine each family's ``refine_top`` best; the best result.

    Packed quality predicts refined quality within a family, not across families, and local
    search is the expensive part. Families after the first are skipped once a result is
    ``good_enough`` (a critical path). ``ranking`` (lower is better) picks which candidates to
    pack at all, when someone (the groups) already rated them."""
    seen: set[bytes] = set()
    failure = PackingError([])
    refined: list[Assignment] = []
    for family in (ANY, WHOLE):
        if refined and min(a.critical_path for a in refined) <= good_enough:
            break
        mine = [i for i, c in enumerate(cands) if c.family == family]
        if ranking is not None:
            mine = [i for i in sorted(mine, key=lambda i: ranking[i]) if np.isfinite(ranking[i])]
        packed = []
        for i in mine:
            key = cands[i].choice.tobytes()
            if key in seen:
                continue
            seen.add(key)
            try:
                packed.append(pack_any_order(space, cands[i].choice))
            except PackingError as e:
                failure = e
                continue
            if ranking is not None and len(packed) == refine_top:
                break
        packed.sort(key=lambda a: a.critical_path)
        refined += [refine(space, a, refine_rounds) for a in packed[:refine_top]]
    if not refined:
        raise failure
    return min(refined, key=lambda a: a.critical_path)
