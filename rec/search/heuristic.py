"""The heuristic stage: the bound and the ladder of candidate selections, the best packed and
refined candidate, and the MILP's first plan when no candidate packs."""

from __future__ import annotations

import numpy as np

from rec.config.search import SearchConfig
from rec.search.assignment import Assignment
from rec.search.bound import LowerBound, lower_bound
from rec.search.candidates import (
    FIRST_FAMILIES,
    LATER_FAMILIES,
    Candidate,
    Ladder,
    best_of,
    candidates,
    priced_steps,
    rooms_beside_every_rank,
)
from rec.search.exact import rescue
from rec.search.pack import PackingError
from rec.search.pricing import PricedTables
from rec.search.refine import refine
from rec.search.select import shard_limits
from rec.search.space import SearchSpace
from rec.search.switch import switch_options


def prepare(space: SearchSpace, config: SearchConfig) -> tuple[LowerBound, Ladder]:
    """The bound and the ladder of candidate selections, computed once for all tables."""
    priced = PricedTables(space)
    bound = lower_bound(space, priced)
    limits = shard_limits(space, bound.largest_shard or bound.value, config.shard_limits)
    return bound, Ladder(tuple(limits), priced_steps(priced, bound), rooms_beside_every_rank(space, tuple(limits)))


def heuristic(space: SearchSpace, ladder: Ladder, config: SearchConfig, bound: LowerBound) -> Assignment:
    """Best assignment over the candidate selections; PackingError if none could be packed."""
    return best_polished(space, candidates(space, ladder), config, bound)


def best_polished(space: SearchSpace, cands: list[Candidate], config: SearchConfig, bound: LowerBound,
                  ranking: np.ndarray | None = None) -> Assignment:
    """The best of the first families' candidates, polished; where that is not close enough to the
    bound, the best of the later families' too, polished apart: the shorter (the first on ties).
    Polishing changes one table at a time, so a better start can end worse: each keeps its own.
    PackingError (the first families') if no candidate could be packed. ``ranking``: ``best_of``'s."""
    good_enough = (1 + config.switch_above_gap) * bound.value
    found: list[Assignment] = []
    failure: PackingError | None = None
    for families in (FIRST_FAMILIES, LATER_FAMILIES):
        if found and found[0].critical_path <= good_enough:
            break
        try:
            a = best_of(space, cands, config.refine_top, config.refine_rounds, good_enough, ranking, families)
        except PackingError as e:
            failure = failure or e
            continue
        polish(space, a, config, bound.value)
        found.append(a)
    if not found:
        raise failure or PackingError([])
    return min(found, key=lambda a: a.critical_path)


def first_plan(space: SearchSpace, ladder: Ladder, config: SearchConfig, bound: LowerBound) -> Assignment:
    """The heuristic's plan, or the MILP's when no candidate packs; PackingError if neither."""
    try:
        return heuristic(space, ladder, config, bound)
    except PackingError as e:
        return rescued(space, config, bound, e)


def rescued(space: SearchSpace, config: SearchConfig, bound: LowerBound, failure: PackingError) -> Assignment:
    """When no candidate packs: the MILP's first plan, refined; ``failure`` again if it has none."""
    a = rescue(space, bound, config)
    if a is None:
        raise failure
    refine(space, a, config.refine_rounds)
    polish(space, a, config, bound.value)
    return a


def polish(space: SearchSpace, a: Assignment, config: SearchConfig, bound: float) -> None:
    """While ``a`` is far enough from the bound, change tables' options and re-refine (in place)."""
    if a.critical_path > (1 + config.switch_above_gap) * bound:
        while switch_options(space, a, config.switch_steps):
            refine(space, a, config.refine_rounds)
