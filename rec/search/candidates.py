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
# Shards above this share of a rank's usable memory make packing fail once replicas and the other
# big shards are down (100,000 tables on 1,024 ranks: 43 GiB shards next to 1 GiB of replicas);
# every selection is tried a second time with each table's shards kept below it, where it can be.
SHARD_MEMORY_CEILING = 0.5


@dataclass(frozen=True)
class Candidate:
    family: int
    choice: np.ndarray  # (T,) option per table


def candidates(space: SearchSpace, limits: list[float]) -> list[Candidate]:
    """Least-work options under each limit, for both families, plus the least-memory choice;
    then both families again with every shard kept under ``SHARD_MEMORY_CEILING``.

    With few tables, whole shards placed freely can balance better than options that load every
    rank (replicas, row splits), even at more total work."""
    whole = (space.placement == FREE) | (space.placement == HOST_FREE)
    small = small_shards(space)
    out = [Candidate(ANY, select_options(space, limit)) for limit in limits]
    total_hbm = space.options.total(space.options.hbm).astype(float)
    out.append(Candidate(ANY, select_options(space, np.inf, cost=total_hbm)))
    out += [Candidate(WHOLE, select_options(space, limit, allowed=whole)) for limit in limits]
    out += [Candidate(ANY, select_options(space, limit, allowed=small)) for limit in limits]
    out += [Candidate(WHOLE, select_options(space, limit, allowed=whole & small)) for limit in limits]
    return out


def small_shards(space: SearchSpace) -> np.ndarray:
    """(O,) options whose every shard stays within ``SHARD_MEMORY_CEILING`` of the smallest
    rank's usable HBM and DDR."""
    opts = space.options
    return ((opts.largest(opts.hbm) <= SHARD_MEMORY_CEILING * space.hbm_cap.min())
            & (opts.largest(opts.ddr) <= SHARD_MEMORY_CEILING * space.ddr_cap.min()))


def least_critical_path(space: SearchSpace, choice: np.ndarray) -> float:
    """No packing of ``choice`` has a shorter critical path: the average work, the largest shard."""
    if not len(choice):
        return 0.0
    return max(float(space.work[choice].sum()) / space.world_size, float(space.max_shard[choice].max()))


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
    search is the expensive part. Candidates are packed in the order of their own bound
    (``least_critical_path``), skipping those another packing already beats. Families after the
    first are skipped once a result is ``good_enough`` (a critical path). ``ranking`` (lower is
    better: the groups' ratings) limits packing to ``refine_top`` best-rated and ``refine_top``
    best-bound candidates per family; a group alone misjudges selections whose big shards only
    balance across all tables, so the bound order is kept as well."""
    seen: set[bytes] = set()
    failure = PackingError([])
    refined: list[Assignment] = []
    for family in (ANY, WHOLE):
        if refined and min(a.critical_path for a in refined) <= good_enough:
            break
        mine = [i for i, c in enumerate(cands) if c.family == family]
        least = {i: least_critical_path(space, cands[i].choice) for i in mine}
        orders = [sorted(mine, key=lambda i: (least[i], i))]
        if ranking is not None:
            orders.insert(0, [i for i in sorted(mine, key=lambda i: (ranking[i], i))
                              if np.isfinite(ranking[i])])
        packed: list[Assignment] = []
        for order in orders:
            quota = len(packed) + refine_top if ranking is not None else len(order)
            for i in order:
                if len(packed) >= quota:
                    break
                key = cands[i].choice.tobytes()
                if key in seen:
                    continue
                seen.add(key)
                # Refining never goes below a selection's own bound: one already beaten is skipped.
                if least[i] >= min((a.critical_path for a in packed + refined), default=np.inf):
                    continue
                try:
                    packed.append(pack_any_order(space, cands[i].choice))
                except PackingError as e:
                    failure = e
        packed.sort(key=lambda a: a.critical_path)
        refined += [refine(space, a, refine_rounds) for a in packed[:refine_top]]
    if not refined:
        raise failure
    return min(refined, key=lambda a: a.critical_path)
