"""After the search: spare HBM grows the caches of uvm tables, where it saves most time per byte.

The search costs every fused_uvm_caching option at one cache size (the spec's ``cache_load_factor``,
else the cost model's ``caching_ratio`` raised to the spec's ``min_cache_load_factor``; a size the
pass grows or starts from is never below that floor), so HBM the plan leaves free is wasted on a
memory-tight workload, and a table the search had to leave on fused_uvm gets no cache at all. This
pass takes each table whose kernel is fused_uvm or fused_uvm_caching and whose spec fixes no cache
size up a ladder of cache sizes (``LOAD_FACTORS``), one step at a time, always taking the step that
saves the most time (its shards' ms over every rank they sit on) per byte of HBM it adds, as
TorchRec's ``EmbeddingOffloadScaleupProposer`` gives memory to the most cacheable tables. A step
must fit every rank it touches; shards stay where they are. A cache whose next rung does not fit
grows as far as its ranks' free HBM allows, between the rungs, and no further (as TorchRec's
scale-up proposer fills the HBM with caches of any size); where TorchRec prices its fetches, to a size of
its hit-rate curve (those TorchRec's statistics were asked at), so that both price it alike. The
search placed the tables knowing only their first cache sizes, so where growing shortened the
critical path (or memory decides, below) a grown plan is searched again with the sizes it grew
(which spreads the tables whose caches grew over the ranks) and grown again, up to
``RESEARCH_ROUNDS`` times while that is faster. Where the plan holds uvm tables and the tables do
not all fit in HBM (``memory_decides``), the search also starts from every cache at each of
``START_SIZES`` (small ones cache more tables, each less), each start grown and searched again so,
and the fastest plan is taken. There the planner gives the first search a short exact stage
(``FIRST_EXACT_SHARE``) and leaves the full one to this pass, which runs it from the fastest plan on
its cache sizes, and from the start at TorchRec's default size (the size TorchRec's own plans cache
at, which the heuristic packs badly where the caches nearly fill the HBM), and grows the results
again; these runs and the first share the time limit (``rec.planning.ExactTime``), each sized from
its share of the limit and stopped where the earlier ones spent it. Where the plan taken then leaves
HBM free off its busiest ranks' caches, those caches are tried larger and the tables searched again at
those sizes, so that the search makes room for them where growing cannot (``_made_room``): growing
moves no shard, and a busiest rank full of tables that fit in HBM keeps its cache small. And the
search starts once more from every table the plan keeps wholly in HBM at its least cache
(``_demoted``): growing never gives HBM back, where caching a table lets a busier one into HBM. Last, the
caches of the plan taken (of both, where that start was faster, the faster kept) are sized once more
on its placement: each from its least size
(``LOAD_FACTORS[0]``, or its floor) grown the same way, kept where faster. Growing only adds to the
sizes the search placed the tables with, so a rank's HBM can stay with caches that save less than
others on it would. Under TorchRec's default profile a larger cache is always faster (its bandwidth
rises linearly with the cache's size, and a table with TorchRec's cache statistics fetches fewer
rows); under a profile with ``cache_miss_multiplier`` the gain follows the table's hit-rate curve, so
tables whose ids repeat get the memory. Where nothing can grow (no uvm table, or no spare HBM) the
result is unchanged, and so it is where growing would be slower: the caches at TorchRec's default
size state none, as in TorchRec's own plans, and TorchRec prices no fetches for them, unless a cache
of another size shares their kernel group (``rec.cost.tables.implicit_caches``): one that grows
makes them state their size and pay them. The pass compares plans by their critical paths as their
plans are built (``rec.search.placed_caches``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace

import numpy as np

from rec.config.cost import UVM_CACHING_RATIO, CostConfig
from rec.cost.enumerator import enumerate_options
from rec.cost.tables import cache_fixed, cache_floors, global_distinct, may_be_cached, resolved_load_factors
from rec.cost.types import Options
from rec.errors import InputError
from rec.passes.context import RELATIVE_GAIN, PassContext
from rec.search.assignment import usage
from rec.search.bound import lower_bound
from rec.search.pipeline import build_search_space, recosted_space
from rec.search.placed_caches import placed_critical_path
from rec.search.result import SearchResult
from rec.search.space import SearchSpace
from rec.sharding import CK_CODE, ComputeDevice, ComputeKernel
from rec.spec.types import Spec, TableSpec
from rec.tolerance import SOLVER_TOLERANCE
from rec.topology.types import Topology

RESEARCH_ROUNDS = 3  # searches again with the grown sizes: the first gains most, a third rarely anything
# The largest is below 1: TorchRec's planner refuses a caching kernel at 1.0 in its plans ("requires
# cache_load_factor strictly between 0 and 1"); a cache of every row is the fused kernel's work at more HBM.
LOAD_FACTORS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99)
# Where the search starts the caches: every rung up to twice TorchRec's default size. The search
# places tables knowing only their first sizes and growing keeps them where they are, so which start
# ends fastest differs by workload; each is one heuristic search.
START_SIZES = tuple(lf for lf in LOAD_FACTORS if lf <= 2 * UVM_CACHING_RATIO)
# Where memory decides, the first search (at the first cache sizes) gets this share of the time limit
# for its exact stage, before the starts are compared: there the heuristic alone can miss by far
# what the MILP finds at once (two_towers-3015 of bench/memory_tight_bench.py: 42.9 ms against
# 14.9, a row_wise cache on every rank beside small tables spread thin). The rest of the limit goes to
# the fastest plan, on the sizes it ends with, and what that leaves to the start at TorchRec's default size.
FIRST_EXACT_SHARE = 0.125
# Where the plan taken leaves this share of the ranks' HBM free, the caches on its busiest ranks are
# tried larger, searched again so that the search makes room for them (``_made_room``), up to this
# many times. In a scratch run on 11 memory-tight workloads, every faster try came from a plan with
# 1.2-7.4% of the HBM free, and none from the nine with 0-0.6% free (each search takes seconds there).
ROOM_SHARE = 0.01
ROOM_ROUNDS = 2
_UVM, _CACHING = CK_CODE[ComputeKernel.FUSED_UVM], CK_CODE[ComputeKernel.FUSED_UVM_CACHING]


@dataclass(frozen=True)
class _Step:
    """A table's shards (runs) at one rung of the ladder: their perf and HBM, aligned with the runs
    of its chosen option."""

    load_factor: float
    option: int  # the option in the enumeration it came from
    perf: np.ndarray
    hbm: np.ndarray


def memory_decides(space: SearchSpace, topology: Topology) -> bool:
    """On cuda, whether the tables do not all fit in HBM (each at its smallest option without a uvm
    kernel), so that every plan keeps some on uvm kernels and this pass chooses their cache sizes."""
    if topology.compute_device is not ComputeDevice.CUDA:
        return False
    opts = space.options
    in_hbm = space.feasible & (opts.compute_kernel != _UVM) & (opts.compute_kernel != _CACHING)
    least = np.full(space.num_tables, np.inf)
    np.minimum.at(least, opts.table[in_hbm], opts.total(opts.hbm)[in_hbm])
    return bool(least.sum() > space.hbm_cap.sum())


def with_cache_sizes(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
                     search: Callable[[SearchSpace], SearchResult] | None = None,
                     exact: Callable[[SearchResult, float], SearchResult] | None = None) -> SearchResult:
    """``result`` with the caches of its uvm tables grown into the HBM it leaves free; with ``search``
    (which searches a space: the heuristic, whose exact stage a space of many small caches can keep
    busy far beyond its time limit), searched again with the sizes it grew while faster, and where
    memory decides, the same from a search with every free cache at each of ``START_SIZES``: the
    fastest of them. With ``exact`` (the exact stage from a result, given a share of its time
    limit), that plan improved by it on its sizes, grown again, and so the start at TorchRec's
    default size where it was not the fastest: the faster of the two; its caches filled between the
    rungs, and a short exact stage again from there. The tables' shards at each cache size are kept
    while it runs (``_steps``), for this call alone: passes in other threads neither see nor drop them."""
    kept = _KEPT_STEPS.set({})
    try:
        return _sized(result, spec, topology, cost, search, exact)
    finally:
        _KEPT_STEPS.reset(kept)


def _sized(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
           search: Callable[[SearchSpace], SearchResult] | None = None,
           exact: Callable[[SearchResult, float], SearchResult] | None = None) -> SearchResult:
    """``with_cache_sizes``'s work, in its context."""

    def built(r: SearchResult) -> float:  # the critical path as its plan states its caches
        return placed_critical_path(r, spec, topology, cost)

    best = _grown(result, spec, topology, cost)
    at_default: SearchResult | None = None  # the start at TorchRec's default cache size
    # Each search covers every table again: worth it where memory decides the plan, or where the
    # grown caches shortened the critical path, not for a few uvm tables off the busiest ranks
    # among many that fit (100,000 tables on 1,024 ranks: 30 s became 192 s with the starts).
    decides = search is not None and memory_decides(result.space, topology)
    if search is not None and len(_candidates(result, spec, topology)):
        if decides or built(best) < built(result) * (1 - RELATIVE_GAIN):
            best = _researched(best, spec, topology, cost, search, built)
        free, floors = ~cache_fixed(spec), cache_floors(spec)
        for start in START_SIZES if decides else ():
            # At TorchRec's default size a floor is the size itself, as TorchRec's own proposers keep
            # a stated load factor; elsewhere a start below the floor starts at the floor.
            sizes = np.where(floors > 0, floors, start) if start == UVM_CACHING_RATIO else np.maximum(start, floors)
            try:
                first = search(build_search_space(spec, topology, cost, np.where(free, sizes, np.nan)))
                other = _grown(first, spec, topology, cost)
            except InputError:  # larger caches may not fit; the other starts stand
                continue
            if start == UVM_CACHING_RATIO:
                at_default = first
            other = _researched(other, spec, topology, cost, search, built)
            if built(other) < built(best) * (1 - RELATIVE_GAIN):
                best = other
    # Growing may be slower where caches went unstated at TorchRec's default size: a cache of another
    # size states the caches of its kernel group, and TorchRec prices the fetches it priced none for
    # (rec.cost.tables.implicit_caches).
    best = _faster(result, best, built)
    if exact is None:
        return _regrown(_filled(best, spec, topology, cost, built), spec, topology, cost, built)

    def exact_grown(start: SearchResult) -> SearchResult:
        improved = exact(start, 1.0)  # never slower than start
        grown = _faster(improved, _grown(improved, spec, topology, cost), built)
        filled = _filled(grown, spec, topology, cost, built)
        # Caches filled between the rungs: the exact stage again, from that plan (a short one: it starts
        # from a plan the full one chose), so that its bound is the plan's.
        return grown if filled is grown else exact(filled, FIRST_EXACT_SHARE)

    searched, best = best, exact_grown(best)
    if at_default is not None and at_default is not searched:
        # TorchRec's plans cache at its default size; where the caches nearly fill the HBM the heuristic
        # packs that start badly and only the exact stage finds its plan (memory_tight_bench
        # --other-shapes one_giant-3214: 535 ms heuristic, 148 exact, against 168 from the best start).
        best = _faster(best, exact_grown(at_default), built)
    if decides and search is not None:  # (decides implies a search; mypy does not know it)
        best = _made_room(best, spec, topology, cost, search, exact, built)
        demoted = _demoted(best, spec, topology, cost, search, exact, built)
        if demoted is not best:  # sized anew on each placement, the slower of the two can end the faster
            return _faster(_regrown(best, spec, topology, cost, built), _regrown(demoted, spec, topology, cost, built),
                           built)
    return _regrown(best, spec, topology, cost, built)


def _demoted(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
             search: Callable[[SearchSpace], SearchResult], exact: Callable[[SearchResult, float], SearchResult],
             path: Callable[[SearchResult], float]) -> SearchResult:
    """``result``, or the plan searched from its caches at their sizes and every table it keeps wholly
    in HBM that may cache at its least size, grown, improved by a short exact stage and filled, where
    faster. Growing only adds HBM: a table the search kept in HBM never gives any back, where caching
    it would let another, busier one into HBM (TorchRec's scale-up proposer caches such tables:
    dropin_memory_tight_probe weighted-50213, 196.86 ms against TorchRec's 194.32, now 188.21 once both
    plans are sized anew on their placements)."""
    space, a = result.space, result.assignment
    kernel = space.options.compute_kernel[a.choice]
    least = least_sizes(spec)
    in_hbm = (kernel != _CACHING) & (kernel != _UVM) & ~np.isnan(least)
    if not in_hbm.any():
        return result
    sizes = np.where(kernel == _CACHING, resolved_load_factors(spec, cost, space.chosen_load_factor), least)
    tried = _searched_at(sizes, spec, topology, cost, search, exact, path)
    return result if tried is None else _faster(result, tried, path)


def _searched_at(sizes: np.ndarray, spec: Spec, topology: Topology, cost: CostConfig,
                 search: Callable[[SearchSpace], SearchResult], exact: Callable[[SearchResult, float], SearchResult],
                 path: Callable[[SearchResult], float]) -> SearchResult | None:
    """The plan searched with the caches at ``sizes`` (those the spec fixes at its own), grown and
    filled, improved by a short exact stage, grown and filled again; None where the caches do not fit."""
    try:
        found = search(build_search_space(spec, topology, cost, np.where(cache_fixed(spec), np.nan, sizes)))
    except InputError:  # the caches do not fit
        return None
    filled = _filled(_grown(found, spec, topology, cost), spec, topology, cost, path)
    improved = exact(filled, FIRST_EXACT_SHARE)
    return _filled(_faster(improved, _grown(improved, spec, topology, cost), path), spec, topology, cost, path)


def _made_room(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
               search: Callable[[SearchSpace], SearchResult], exact: Callable[[SearchResult, float], SearchResult],
               path: Callable[[SearchResult], float]) -> SearchResult:
    """``result``, or a plan whose busiest ranks' caches are larger where the search made room for them.
    Growing keeps every shard where the search put it, so a busiest rank full of tables that fit in HBM
    keeps its cache small while other ranks' HBM stays free. Where at least ``ROOM_SHARE`` of the ranks'
    HBM is free, the caches on the busiest ranks are tried a rung larger, and larger by the free HBM
    shared among them; each try is searched at those sizes (the heuristic, then a short exact stage),
    grown and filled, and the faster is taken where faster than the plan; up to ``ROOM_ROUNDS`` times."""
    fetches = global_distinct(spec, topology.batch_size * topology.world_size) > 0
    for _ in range(ROOM_ROUNDS):
        space, a = result.space, result.assignment
        free_hbm = float(np.clip(space.hbm_cap - a.hbm, 0, None).sum())
        caches = _busiest_caches(result, spec, topology)
        if free_hbm < ROOM_SHARE * float(space.hbm_cap.sum()) or not len(caches):
            break
        base = resolved_load_factors(spec, cost, space.chosen_load_factor)
        opts = space.options
        rung_up, shared_up = base.copy(), base.copy()
        for t in caches:
            above = [lf for lf in LOAD_FACTORS if lf > base[t] * (1 + 1e-12)]
            rung_up[t] = above[0] if above else base[t]
            shards = opts.shards(int(a.choice[t]))
            hbm = float((opts.hbm[shards] * opts.repeat[shards]).sum())  # the cache's HBM, and a little more
            grown = min(LOAD_FACTORS[-1], base[t] * (1 + free_hbm / len(caches) / hbm))
            # where TorchRec prices its fetches, a size its statistics were asked at (as _grown)
            grown = _asked_size(spec.tables[t], grown) if fetches[t] else _rounded_down(grown)
            shared_up[t] = max(base[t], grown)
        tries = [tried for sizes in (rung_up, shared_up)
                 if (tried := _searched_at(sizes, spec, topology, cost, search, exact, path)) is not None]
        fastest = min(tries, key=path, default=None)
        if fastest is None or not path(fastest) < path(result) * (1 - RELATIVE_GAIN):
            break
        result = fastest
    return result


def _busiest_caches(result: SearchResult, spec: Spec, topology: Topology) -> list[int]:
    """The fused_uvm_caching tables the planner sizes with a shard on a busiest rank."""
    space, a = result.space, result.assignment
    opts = space.options
    kernel = opts.compute_kernel[a.choice]
    busiest = a.loads >= a.critical_path * (1 - SOLVER_TOLERANCE)
    out = []
    for t in _candidates(result, spec, topology):
        if kernel[t] != _CACHING:
            continue
        shards = opts.shards(int(a.choice[t]))
        first, repeat = a.shard_rank[shards].astype(np.int64), opts.repeat[shards].astype(np.int64)
        if (busiest & (_per_rank(first, repeat, np.ones(len(first), np.int64), space.world_size) > 0)).any():
            out.append(int(t))
    return out


def _filled(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
            path: Callable[[SearchResult], float]) -> SearchResult:
    """The plan taken, its caches grown between the rungs where the next does not fit: after every
    search, start and exact stage was compared on the ladder's sizes, so that it only shortens the
    plan they chose."""
    return _faster(result, _grown(result, spec, topology, cost, between=True), path)


def _regrown(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
             path: Callable[[SearchResult], float]) -> SearchResult:
    """``result`` with its caches sized anew on its placement: each at its least size, then grown
    (between the rungs too), where that is faster. Growing only adds to the sizes a search placed
    the tables with, so a rank's HBM can stay with caches that save less than others would."""
    kernel = result.space.options.compute_kernel[result.assignment.choice]
    caching = [int(t) for t in _candidates(result, spec, topology) if kernel[t] == _CACHING]
    if not caching:
        return result
    least = least_sizes(spec)
    shrunk = _rebuilt(result, spec, topology, cost, {t: float(least[t]) for t in caching}, only_faster=False)
    if shrunk is result:
        return result
    return _faster(result, _filled(_grown(shrunk, spec, topology, cost), spec, topology, cost, path), path)


def least_sizes(spec: Spec) -> np.ndarray:
    """(T,) the least cache size of each table the planner sizes: its floor, else the ladder's first
    rung (NaN: the spec fixes it, or it cannot cache)."""
    free = ~cache_fixed(spec) & np.fromiter(map(may_be_cached, spec.tables), bool, len(spec.tables))
    least: np.ndarray = np.where(free, np.maximum(cache_floors(spec), LOAD_FACTORS[0]), np.nan)
    return least


def _faster(first: SearchResult, other: SearchResult, path: Callable[[SearchResult], float]) -> SearchResult:
    """``other`` where its critical path (``path``: as its plan is built) is shorter, else ``first``."""
    return other if path(other) < path(first) else first


def _researched(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
                search: Callable[[SearchSpace], SearchResult], path: Callable[[SearchResult], float]
                ) -> SearchResult:
    """``result`` searched again with the cache sizes it grew, and grown again, while that is faster."""
    for _ in range(RESEARCH_ROUNDS):
        if result.space.chosen_load_factor is None:
            break
        # result.space is costed with the sizes it grew (``_rebuilt``): the search starts afresh on it.
        try:
            again = _grown(search(result.space), spec, topology, cost)
        except InputError:
            break
        if not path(again) < path(result) * (1 - RELATIVE_GAIN):
            break
        result = again
    return result


def _candidates(result: SearchResult, spec: Spec, topology: Topology) -> np.ndarray:
    """Tables on a uvm kernel whose spec fixes no cache size (none on cpu)."""
    if topology.compute_device is not ComputeDevice.CUDA:
        return np.zeros(0, np.int64)
    kernel = result.space.options.compute_kernel[result.assignment.choice]
    return np.flatnonzero(((kernel == _UVM) | (kernel == _CACHING)) & ~cache_fixed(spec))


def _grown(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
           between: bool = False) -> SearchResult:
    """``result`` with the caches of its uvm tables grown into the HBM it leaves free, rung by rung
    (``between``: and a cache whose next rung does not fit as far as the HBM allows)."""
    space, a = result.space, result.assignment
    kernel = space.options.compute_kernel[a.choice]
    base = resolved_load_factors(spec, cost, space.chosen_load_factor)
    candidates = _candidates(result, spec, topology)
    if not len(candidates):
        return result
    ladders = _ladders(result, spec, topology, cost, candidates, kernel, base)
    if not ladders:
        return result
    opts = space.options

    fetches = global_distinct(spec, topology.batch_size * topology.world_size) > 0

    def step_at(t: int, lf: float) -> _Step | None:
        """Table ``t``'s shards with a cache of ``lf`` (where TorchRec prices its fetches: of the largest
        size of its hit-rate curve up to ``lf``, which TorchRec's statistics gave), in its sharding type."""
        if fetches[t]:
            lf = _asked_size(spec.tables[t], lf)
            if lf <= current[t]:
                return None
        return _steps([t], {t: int(opts.sharding_type[a.choice[t]])}, spec, topology, cost, lf)[t]

    current = {t: float(base[t]) for t in ladders if kernel[t] == _CACHING}
    chosen = _grow(result, ladders, current, step_at if between else None)
    if not chosen:
        return result
    return _rebuilt(result, spec, topology, cost, chosen)


def _ladders(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig, candidates: np.ndarray,
             kernel: np.ndarray, base: np.ndarray) -> dict[int, list[_Step]]:
    """Each candidate table's rungs above where it is (its cache's size, or none on fused_uvm)."""
    space, a = result.space, result.assignment
    sharding_type = {int(t): int(space.options.sharding_type[a.choice[t]]) for t in candidates}
    ladders: dict[int, list[_Step]] = {int(t): [] for t in candidates}
    floors = cache_floors(spec)
    for lf in LOAD_FACTORS:
        above = [int(t) for t in candidates
                 if (kernel[t] == _UVM and lf >= floors[t]) or lf > base[t] * (1 + 1e-12)]
        for t, step in _steps(above, sharding_type, spec, topology, cost, lf).items():
            if step is not None:  # else this table's allow-lists or sharder offer no cache with its sharding type
                ladders[t].append(step)
    return {t: steps for t, steps in ladders.items() if steps}


# Each table's shards at one cache size in one sharding type, kept while a pass runs (``_steps``).
_KEPT_STEPS: ContextVar[dict[tuple[Topology, CostConfig, TableSpec, float, int], _Step | None] | None] = \
    ContextVar("kept_steps", default=None)


def _steps(tables: list[int], sharding_type: dict[int, int], spec: Spec, topology: Topology, cost: CostConfig,
           lf: float) -> dict[int, _Step | None]:
    """Each of ``tables``' shards with a cache of ``lf`` in its ``sharding_type``: a pass grows caches
    from the same ladders many times over, and enumerating the options was most of its time, so
    each table is enumerated at a size once a pass (those not yet, together)."""
    def key(t: int) -> tuple[Topology, CostConfig, TableSpec, float, int]:
        return topology, cost, spec.tables[t], lf, sharding_type[t]

    kept = _KEPT_STEPS.get()
    if kept is None:  # outside a pass: nothing to keep them for
        kept = {}
    missing = [t for t in tables if key(t) not in kept]
    if missing:
        rung = enumerate_options(Spec(tuple(spec.tables[t] for t in missing), spec.spec_hash), topology, cost,
                                 np.full(len(missing), lf))
        for k, t in enumerate(missing):
            kept[key(t)] = _step(rung, k, sharding_type[t], lf)
    return {t: kept[key(t)] for t in tables}


def _step(rung: Options, table: int, sharding_type: int, lf: float) -> _Step | None:
    """Table ``table`` of the enumeration ``rung`` (at cache size ``lf``) cached in ``sharding_type``."""
    match = np.flatnonzero((rung.table == table) & (rung.sharding_type == sharding_type)
                           & (rung.compute_kernel == _CACHING))
    if not len(match):
        return None
    o = int(match[0])
    return _Step(lf, o, rung.perf[rung.shards(o)], rung.hbm[rung.shards(o)])


def _grow(result: SearchResult, ladders: dict[int, list[_Step]], current: dict[int, float],
          step_at: Callable[[int, float], _Step | None] | None) -> dict[int, float]:
    """Greedy over steps by ms saved per HBM byte added, each step fitting every rank it touches.
    With ``step_at`` (a table's shards at any size), a cache (``current``: the sizes of the caching
    tables) whose next rung does not fit grows as far as its ranks' free HBM lets it, between the
    rungs, as TorchRec's scale-up proposer fills the HBM; it grows no further."""
    space, a = result.space, result.assignment
    opts = space.options
    hbm = a.hbm.astype(np.int64).copy()
    cap = space.hbm_cap
    now: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    ranks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for t in ladders:
        entries = np.arange(*opts.shards(int(a.choice[t])).indices(len(opts.perf)))
        now[t] = (opts.perf[entries], opts.hbm[entries])
        ranks[t] = (a.shard_rank[entries].astype(np.int64), opts.repeat[entries].astype(np.int64))
    heap: list[tuple[float, int, int]] = []
    position = dict.fromkeys(ladders, 0)

    def push(t: int) -> None:
        steps = ladders[t]
        while position[t] < len(steps):
            step = steps[position[t]]
            perf, mem = now[t]
            _, rep = ranks[t]
            saved = float(((perf - step.perf) * rep).sum())
            added = float(((step.hbm - mem) * rep).sum())
            if saved > 0 and added > 0:
                heapq.heappush(heap, (-saved / added, t, position[t]))
                return
            position[t] += 1  # no faster, or no larger: look further up

    for t in ladders:
        push(t)
    chosen: dict[int, float] = {}
    while heap:
        _, t, k = heapq.heappop(heap)
        step = ladders[t][k]
        first, rep = ranks[t]
        delta = _per_rank(first, rep, step.hbm - now[t][1], len(hbm))
        if (hbm + delta > cap).any():  # larger rungs need more: this table's cache stops here, or between
            partial = (None if step_at is None
                       else _between(t, current.get(t), step, hbm, cap, delta, now[t], ranks[t], step_at))
            if partial is not None:
                hbm += _per_rank(first, rep, partial.hbm - now[t][1], len(hbm))
                now[t] = (partial.perf, partial.hbm)
                chosen[t] = current[t] = partial.load_factor
            continue
        hbm += delta
        now[t] = (step.perf, step.hbm)
        chosen[t] = step.load_factor
        current[t] = step.load_factor
        position[t] = k + 1
        push(t)
    return chosen


BETWEEN_DIGITS = 4  # a size between rungs is rounded down to this many decimals
BETWEEN_TRIES = 3  # sizes tried between rungs, each a little smaller where rounding left it too large


def _between(t: int, lf: float | None, step: _Step, hbm: np.ndarray, cap: np.ndarray, delta: np.ndarray,
             now: tuple[np.ndarray, np.ndarray], ranks: tuple[np.ndarray, np.ndarray],
             step_at: Callable[[int, float], _Step | None]) -> _Step | None:
    """Table ``t``'s cache (now of size ``lf``; None: no cache) grown towards ``step``, which does not
    fit (``delta``: its HBM per rank), as far as every rank's free HBM lets it (a cache's HBM grows
    linearly with its size); None where that is no larger, or no faster."""
    if lf is None or step.load_factor <= lf:
        return None
    grows = delta > 0
    share = float(np.min((cap[grows] - hbm[grows]) / delta[grows])) if grows.any() else 0.0
    first, rep = ranks
    for _ in range(BETWEEN_TRIES):
        size = _rounded_down(lf + share * (step.load_factor - lf))
        if share <= 0 or size <= lf:
            return None
        partial = step_at(t, float(size))
        if partial is None or not float(((now[0] - partial.perf) * rep).sum()) > 0:
            return None
        if not (hbm + _per_rank(first, rep, partial.hbm - now[1], len(hbm)) > cap).any():
            return partial
        share *= 0.99
    return None


def _rounded_down(lf: float) -> float:
    """A cache size between rungs, rounded down to ``BETWEEN_DIGITS`` decimals."""
    return float(np.floor(lf * 10**BETWEEN_DIGITS) / 10**BETWEEN_DIGITS)


def _asked_size(table: TableSpec, lf: float) -> float:
    """The largest size of ``table``'s hit-rate curve up to ``lf`` (0 if none): where TorchRec prices a
    cache's fetches, the sizes its statistics were asked at are those it prices alike."""
    return max((f for f, _ in table.hit_rate_curve or () if f <= lf), default=0.0)


def _per_rank(first: np.ndarray, repeat: np.ndarray, values: np.ndarray, world: int) -> np.ndarray:
    """(W,) ``values`` of runs starting at ``first`` and covering ``repeat`` ranks each, per rank."""
    out = np.zeros(world, np.int64)
    for f, r, v in zip(first.tolist(), repeat.tolist(), values.tolist(), strict=True):
        out[f:f + r] += v
    return out


def _rebuilt(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig,
             chosen: dict[int, float], only_faster: bool = True) -> SearchResult:
    """The same placement in a space costed with the chosen cache sizes (uvm tables given caches);
    with ``only_faster``, ``result`` itself where that is slower as the plans are built."""
    old, a = result.space, result.assignment
    factors = np.full(len(spec.tables), np.nan) if old.chosen_load_factor is None else old.chosen_load_factor.copy()
    for t, lf in chosen.items():
        factors[t] = lf
    space = recosted_space(old, spec, topology, cost, factors, np.array(sorted(chosen)))
    choice = a.choice.copy()
    shard_rank = a.shard_rank.copy()
    for t in chosen:
        o = int(a.choice[t])
        if old.options.compute_kernel[o] == _UVM:
            caching = _same_option(space.options, old.options, o, _CACHING)
            shard_rank[space.options.shards(caching)] = a.shard_rank[old.options.shards(o)]
            shard_rank[old.options.shards(o)] = -1
            choice[t] = caching
    assignment = usage(space, choice, shard_rank)
    grown = replace(result, space=space, assignment=assignment, bound=lower_bound(space))
    if (assignment.hbm > space.hbm_cap).any():
        return result  # cannot happen step by step; kept as a guard for the plan's validity
    if not only_faster:
        return grown
    # Slower where a grown cache states the default-size caches of its kernel groups.
    built = [placed_critical_path(r, spec, topology, cost) for r in (result, grown)]
    return result if built[1] > built[0] else grown


def _same_option(new: Options, old: Options, option: int, kernel: int) -> int:
    """The option of ``new`` with ``option``'s table and sharding type and ``kernel``."""
    match = np.flatnonzero((new.table == old.table[option]) & (new.sharding_type == old.sharding_type[option])
                           & (new.compute_kernel == kernel))
    return int(match[0])


class CacheSizes:
    """``with_cache_sizes`` as a whole-plan pass: on cuda, where uvm kernels exist."""

    def applies(self, context: PassContext) -> bool:
        return context.topology.compute_device is ComputeDevice.CUDA

    def run(self, result: SearchResult, context: PassContext) -> SearchResult:
        return with_cache_sizes(result, context.spec, context.topology, context.cost, context.heuristic,
                                context.exact)
