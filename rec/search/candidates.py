"""Candidate selections: one option per table for each (family, largest-shard limit, prices).

Selection is per table, so a candidate restricted to a group of tables is that group's own
candidate for the same family and ladder step: groups searched apart line up index by index.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from rec.search.assignment import Assignment
from rec.search.bound import LowerBound
from rec.search.pack import PackingError, PackOrder, pack
from rec.search.placement import Placement, movable
from rec.search.pricing import PricedTables, Prices, Resource
from rec.search.refine import refine
from rec.search.select import first_min_per_table, select_options
from rec.search.space import SearchSpace


class Family(StrEnum):
    """How a candidate selection was made; packing and refinement rank candidates per family."""

    ANY = "any"  # least work under a largest-shard limit
    WHOLE = "whole"  # the same, whole shards placed freely (no replicas, no row splits)
    PRICED = "priced"  # least work + priced memory: the bound's memory prices, rounded to fit
    BESIDE = "beside"  # least work, shards that fit beside those on every rank (the ladder's rooms)


# The heuristic polishes the best of the first families, and apart from it the best of the later ones
# (``rec.search.heuristic.best_polished``).
FIRST_FAMILIES = (Family.ANY, Family.WHOLE, Family.PRICED)
LATER_FAMILIES = (Family.BESIDE,)


# Shards above this share of a rank's usable memory make packing fail once replicas and the other
# big shards are down (100,000 tables on 1,024 ranks: 43 GiB shards next to 1 GiB of replicas);
# every selection is tried a second time with each table's shards kept below it, where it can be.
SHARD_MEMORY_CEILING = 0.5
# Priced selections: largest-shard limits as multiples of the priced bound, and the share of the
# ranks' total memory a selection may fill (below 1 leaves packing room on every rank).
PRICED_LIMITS = (0.7, 0.85, 1.0, 1.2, 1.5)
PRICED_BUDGETS = (1.0, 0.98, 0.95, 0.9)
NO_PRICES = Prices()
REPAIR_ROUNDS = 8  # packing attempts of a priced selection, moving failing tables to smaller shards


@dataclass(frozen=True)
class Candidate:
    family: Family
    choice: np.ndarray  # (T,) option per table
    prices: Prices = NO_PRICES  # PRICED: the memory prices it was selected with


@dataclass(frozen=True)
class Ladder:
    """The global parameters of every candidate selection, computed once for all tables and
    shipped to the groups: largest-shard limits, (memory prices, limit) pairs, and per limit the
    (HBM, DDR) bytes a rank keeps beside the shards every rank holds (``rooms_beside_every_rank``)."""

    limits: tuple[float, ...]
    priced: tuple[tuple[Prices, float], ...] = ()
    rooms: tuple[tuple[float, float], ...] = ()


def rooms_beside_every_rank(space: SearchSpace, limits: tuple[float, ...]) -> tuple[tuple[float, float], ...]:
    """Per limit: the HBM and DDR the smallest rank has left beside the shards of the limit's
    least-work selection that sit on every rank (row_wise, data_parallel)."""
    opts = space.options
    every_rank = space.placement == Placement.EVERY_RANK
    largest_hbm, largest_ddr = opts.largest(opts.hbm).astype(float), opts.largest(opts.ddr).astype(float)
    out = []
    for limit in limits:
        choice = select_options(space, limit)
        held = choice[every_rank[choice]]
        out.append((float(space.hbm_cap.min()) - float(largest_hbm[held].sum()),
                    float(space.ddr_cap.min()) - float(largest_ddr[held].sum())))
    return tuple(out)


def priced_steps(priced: PricedTables, bound: LowerBound) -> tuple[tuple[Prices, float], ...]:
    """Where memory binds: for each limit and budget, the least price of the binding resource
    whose selection fits the budget (the other resource at the bound's price)."""
    if bound.prices == NO_PRICES:
        return ()
    resource = Resource.HBM if bound.prices.hbm > 0 else Resource.DDR
    out: list[tuple[Prices, float]] = []
    for m in PRICED_LIMITS:
        limit = m * bound.lagrangian
        for share in PRICED_BUDGETS:
            p = priced.price_for(resource, share, limit, bound.prices)
            if np.isfinite(p):
                prices = bound.prices.with_price(resource, p)
                if (prices, limit) not in out:
                    out.append((prices, limit))
    return tuple(out)


def candidates(space: SearchSpace, ladder: Ladder) -> list[Candidate]:
    """Least-work options under each limit, for both families, plus the least-memory choice;
    then both families again with every shard kept under ``SHARD_MEMORY_CEILING``; then the
    priced selections; then least work with the shards not on every rank kept under that share of
    what the shards on every rank leave (the ladder's ``rooms``).

    With few tables, whole shards placed freely can balance better than options that load every
    rank (replicas, row splits), even at more total work."""
    limits = ladder.limits
    whole = movable(space.placement)
    small = small_shards(space)
    out = [Candidate(Family.ANY, select_options(space, limit)) for limit in limits]
    opts = space.options
    total_hbm = opts.total(opts.hbm).astype(float)
    out.append(Candidate(Family.ANY, select_options(space, np.inf, cost=total_hbm)))
    # ... and the one that fills a rank least (its largest shard, of each memory's capacity): the
    # least total HBM can put a whole table on one rank's DDR, beside what every rank holds.
    fill = (opts.largest(opts.hbm) / max(float(space.hbm_cap.min()), 1.0)
            + opts.largest(opts.ddr) / max(float(space.ddr_cap.min()), 1.0))
    out.append(Candidate(Family.ANY, select_options(space, np.inf, cost=fill)))
    out += [Candidate(Family.WHOLE, select_options(space, limit, allowed=whole)) for limit in limits]
    out += [Candidate(Family.ANY, select_options(space, limit, allowed=small)) for limit in limits]
    out += [Candidate(Family.WHOLE, select_options(space, limit, allowed=whole & small)) for limit in limits]
    if ladder.priced:
        total_ddr = opts.total(opts.ddr).astype(float)
        out += [Candidate(Family.PRICED, select_options(space, limit, cost=space.work + p.hbm * total_hbm
                                                        + p.ddr * total_ddr), p)
                for p, limit in ladder.priced]
    # A row_wise table whose cache nearly fills every rank (a giant one, memory-tight) leaves less
    # beside it than the ceiling allows: the other tables' shards must fit what it leaves. Where the
    # shards on every rank take at most the rest of a rank, each shard below the ceiling fits beside.
    every_rank = space.placement == Placement.EVERY_RANK
    out += [Candidate(Family.BESIDE, select_options(space, limit,
                                                    allowed=every_rank | small_shards(space, hbm_room, ddr_room)))
            for limit, (hbm_room, ddr_room) in zip(limits, ladder.rooms, strict=False)
            if hbm_room < (1 - SHARD_MEMORY_CEILING) * space.hbm_cap.min()
            or ddr_room < (1 - SHARD_MEMORY_CEILING) * space.ddr_cap.min()]
    return out


def small_shards(space: SearchSpace, hbm_room: float | None = None, ddr_room: float | None = None) -> np.ndarray:
    """(O,) options whose every shard stays within ``SHARD_MEMORY_CEILING`` of ``hbm_room`` and
    ``ddr_room`` bytes (default: the smallest rank's usable HBM and DDR)."""
    opts = space.options
    hbm = float(space.hbm_cap.min()) if hbm_room is None else hbm_room
    ddr = float(space.ddr_cap.min()) if ddr_room is None else ddr_room
    return np.asarray((opts.largest(opts.hbm) <= SHARD_MEMORY_CEILING * hbm)
                      & (opts.largest(opts.ddr) <= SHARD_MEMORY_CEILING * ddr))


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
            return pack(space, choice, order, start)
        except PackingError as e:
            failure = e
    raise failure


def pack_candidate(space: SearchSpace, cand: Candidate, start: Assignment | None = None) -> Assignment:
    """Pack a candidate. Priced selections fill the ranks' memory in total, so the last tables
    placed may find no rank with room: those tables' memory prices are doubled (repeatedly, at
    most ``REPAIR_ROUNDS`` times) and they take the option that is then cheapest among those
    using less memory."""
    if cand.family is not Family.PRICED:
        return pack_any_order(space, cand.choice, start)
    choice = cand.choice.copy()
    opts = space.options
    hbm, ddr = opts.total(opts.hbm).astype(float), opts.total(opts.ddr).astype(float)
    weight = np.ones(space.num_tables)
    for _ in range(REPAIR_ROUNDS):
        try:
            return pack_any_order(space, choice, start)
        except PackingError as e:
            failed = np.asarray(e.tables, dtype=np.int64)
            weight[failed] *= 2
            w = weight[opts.table]
            memory = cand.prices.hbm * hbm + cand.prices.ddr * ddr
            smaller = memory < memory[choice][opts.table]
            cost = np.where(space.feasible & smaller & np.isin(opts.table, failed),
                            space.work + w * memory, np.inf)
            best = first_min_per_table(space, cost)
            can = np.isfinite(cost[best])[failed]
            if not can.any():
                raise
            choice[failed[can]] = best[failed[can]]
    return pack_any_order(space, choice, start)


def best_of(space: SearchSpace, cands: list[Candidate], refine_top: int, refine_rounds: int,
            good_enough: float = 0.0, ranking: np.ndarray | None = None,
            families: tuple[Family, ...] = tuple(Family)) -> Assignment:
    """Pack the candidates of ``families`` and refine each family's ``refine_top`` best; the best result.

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
    for family in families:
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
            # Groups misjudge priced selections most (their background holds no memory prices):
            # those few are all packed, as in the search of all tables at once.
            rated = ranking is not None and family is not Family.PRICED
            quota = len(packed) + refine_top if rated else len(order)
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
                    packed.append(pack_candidate(space, cands[i]))
                except PackingError as e:
                    failure = e
        packed.sort(key=lambda a: a.critical_path)
        for a in packed[:refine_top]:
            refine(space, a, refine_rounds)
        refined += packed[:refine_top]
    if not refined:
        raise failure
    return min(refined, key=lambda a: a.critical_path)
