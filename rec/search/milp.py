"""The plan problem as a mixed-integer program over the search space, solved with HiGHS.

Columns: ``z`` (the critical path, minimised); ``x[o]`` binary, one option per table; for
free-placed options (table_wise, column_wise) an integer count ``n[c, r]`` of the option's
identical shards of class ``c`` on rank ``r``; for host-bound options (table_row_wise,
table_column_wise, grid_shard) a binary host ``y[o, h]`` (table_column_wise also counts its
shards per rank within the host); data_parallel and row_wise put fixed loads on every rank.
Rows: per rank, time <= z and HBM/DDR within capacity; per table, one option and its largest shard
<= z (a cut the LP relaxation needs); per option, its shards all placed.

Times are scaled by a reference time and memory by the largest rank capacity so that HiGHS's
tolerances mean the same at any size. A solution is turned back into an ``Assignment`` and its
loads recomputed exactly; one that overflows a rank by HiGHS's tolerance is rejected.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from rec.cost.types import Options
from rec.highs.instance import MODEL_ARRAYS
from rec.highs.process import HIGHS
from rec.search.assignment import Assignment, usage
from rec.search.placement import Placement
from rec.search.space import SearchSpace, run_ranks
from rec.tolerance import SOLVER_TOLERANCE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MilpModel:
    """The model's arrays (column-wise sparse matrix) and what each column stands for."""

    num_cols: int
    num_rows: int
    cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray  # (cols,) bool
    row_lower: np.ndarray
    row_upper: np.ndarray
    start: np.ndarray  # CSC
    index: np.ndarray
    value: np.ndarray
    time_scale: float  # ms per unit of z
    options: np.ndarray  # (K,) the options in the model
    x_col: np.ndarray  # (K,) column of x[o]
    host_col: np.ndarray  # (K,) first of num_hosts y columns, -1 if none
    class_option: np.ndarray  # (C,) model option (index into options) of each shard class
    class_entries: list[np.ndarray]  # (C,) entries of each class
    class_col: np.ndarray  # (C,) first of len(free_ranks) n columns
    free_ranks: np.ndarray  # ranks free-placed shards may go to, one n column each

    @property
    def nonzeros(self) -> int:
        return len(self.value)


class _Builder:
    def __init__(self) -> None:
        self.cols = 0
        self.rows = 0
        self.col_parts: dict[str, list[np.ndarray]] = {k: [] for k in ("cost", "lo", "up", "int")}
        self.row_parts: dict[str, list[np.ndarray]] = {k: [] for k in ("lo", "up")}
        self.entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add_cols(self, n: int, lo: ArrayLike = 0.0, up: ArrayLike = 1.0, integer: bool = True,
                 cost: ArrayLike = 0.0) -> int:
        first = self.cols
        self.cols += n
        self.col_parts["cost"].append(np.broadcast_to(np.asarray(cost, float), (n,)))
        self.col_parts["lo"].append(np.broadcast_to(np.asarray(lo, float), (n,)))
        self.col_parts["up"].append(np.broadcast_to(np.asarray(up, float), (n,)))
        self.col_parts["int"].append(np.full(n, integer))
        return first

    def add_rows(self, n: int, lo: ArrayLike, up: ArrayLike) -> int:
        first = self.rows
        self.rows += n
        self.row_parts["lo"].append(np.broadcast_to(np.asarray(lo, float), (n,)))
        self.row_parts["up"].append(np.broadcast_to(np.asarray(up, float), (n,)))
        return first

    def add(self, rows: ArrayLike, cols: ArrayLike, values: ArrayLike) -> None:
        rows, cols, values = np.broadcast_arrays(np.asarray(rows, np.int64), np.asarray(cols, np.int64),
                                                 np.asarray(values, float))
        keep = values != 0
        self.entries.append((rows[keep].ravel(), cols[keep].ravel(), values[keep].ravel()))

    def matrix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = np.concatenate([e[0] for e in self.entries])
        cols = np.concatenate([e[1] for e in self.entries])
        vals = np.concatenate([e[2] for e in self.entries])
        order = np.lexsort((rows, cols))
        rows, cols, vals = rows[order], cols[order], vals[order]
        first = np.concatenate(([True], (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])))
        vals = np.add.reduceat(vals, np.flatnonzero(first)) if len(vals) else vals
        rows, cols = rows[first], cols[first]
        start = np.searchsorted(cols, np.arange(self.cols + 1))
        return start, rows, vals


def build_model(space: SearchSpace, options: np.ndarray, time_scale: float,
                z_bounds: tuple[float, float], background: Assignment | None = None,
                free_ranks: np.ndarray | None = None) -> MilpModel:
    """The MILP over ``options`` (the allowed options of the tables it places, grouped by
    table) on top of the load and memory of ``background`` (the other tables, held in place),
    with free-placed shards restricted to ``free_ranks`` (default: every rank)."""
    free_ranks = np.arange(space.world_size) if free_ranks is None else np.asarray(free_ranks, np.int64)
    b = _Builder()
    z = b.add_cols(1, lo=z_bounds[0] / time_scale, up=z_bounds[1] / time_scale, integer=False, cost=1.0)
    ranks = _RankRows.add(b, space, z, time_scale, background)
    x_col = _one_option_per_table(b, space, options, z, time_scale)
    kind = _placements(space, options)
    _put_fixed(ranks, space, options, kind, x_col)
    host_col = _put_host_bound(b, ranks, space, options, kind, x_col)
    classes = _put_free(b, ranks, space, options, kind, x_col, host_col, free_ranks)
    start, index, value = b.matrix()
    cat = {k: np.concatenate(v) for k, v in b.col_parts.items()}
    return MilpModel(b.cols, b.rows, cat["cost"], cat["lo"], cat["up"], cat["int"].astype(bool),
                     np.concatenate(b.row_parts["lo"]), np.concatenate(b.row_parts["up"]),
                     start, index, value, time_scale, options, x_col, host_col, classes.option,
                     classes.entries, classes.col, free_ranks)


@dataclass(frozen=True)
class _RankRows:
    """Per rank: time <= z, HBM and DDR within what ``background`` leaves; and how a shard
    placed on a rank enters them."""

    builder: _Builder
    options: Options
    load: int  # first row of each kind
    hbm: int
    ddr: int
    time_scale: float
    mem_scale: float

    @staticmethod
    def add(b: _Builder, space: SearchSpace, z: int, time_scale: float, background: Assignment | None) -> _RankRows:
        w = space.world_size
        mem_scale = float(max(space.hbm_cap.max(), space.ddr_cap.max(), 1))
        bg_load, bg_hbm, bg_ddr = ((background.loads, background.hbm, background.ddr) if background is not None
                                   else (np.zeros(w), np.zeros(w), np.zeros(w)))
        load = b.add_rows(w, -np.inf, -bg_load / time_scale)
        hbm = b.add_rows(w, -np.inf, (space.hbm_cap - bg_hbm) / mem_scale)
        ddr = b.add_rows(w, -np.inf, (space.ddr_cap - bg_ddr) / mem_scale)
        b.add(load + np.arange(w), z, -1.0)
        return _RankRows(b, space.options, load, hbm, ddr, time_scale, mem_scale)

    def put(self, ranks: np.ndarray, cols: np.ndarray, entries: np.ndarray) -> None:
        """Column ``cols[i]`` puts one shard of entry ``entries[i]`` on rank ``ranks[i]``."""
        opts = self.options
        self.builder.add(self.load + ranks, cols, opts.perf[entries] / self.time_scale)
        self.builder.add(self.hbm + ranks, cols, opts.hbm[entries] / self.mem_scale)
        self.builder.add(self.ddr + ranks, cols, opts.ddr[entries] / self.mem_scale)


def _one_option_per_table(b: _Builder, space: SearchSpace, options: np.ndarray, z: int,
                          time_scale: float) -> np.ndarray:
    """The ``x`` columns, one option per table, and each table's largest shard <= z; ``x``'s columns."""
    tables = space.options.table[options]
    first_of_table = np.concatenate(([True], tables[1:] != tables[:-1]))
    table_no = np.cumsum(first_of_table) - 1
    n_tables = int(table_no[-1]) + 1 if len(options) else 0
    one_row = b.add_rows(n_tables, 1.0, 1.0)
    cut_row = b.add_rows(n_tables, -np.inf, 0.0)
    b.add(cut_row + np.arange(n_tables), z, -1.0)
    x_col: np.ndarray = b.add_cols(len(options)) + np.arange(len(options))
    b.add(one_row + table_no, x_col, 1.0)
    b.add(cut_row + table_no, x_col, space.max_shard[options] / time_scale)
    return x_col


def _placements(space: SearchSpace, options: np.ndarray) -> np.ndarray:
    """Each option's placement; on one host, host-bound placements are fixed or free ones."""
    kind: np.ndarray = space.placement[options]
    if space.num_hosts == 1:
        kind = np.where(kind == Placement.HOST_UNIFORM, Placement.EVERY_RANK, kind)
        kind = np.where(kind == Placement.HOST_FREE, Placement.FREE, kind)
    return kind


def _put_fixed(ranks: _RankRows, space: SearchSpace, options: np.ndarray, kind: np.ndarray,
               x_col: np.ndarray) -> None:
    """Fixed loads: entry e of option o covers ranks position..position+repeat-1."""
    fixed = np.flatnonzero(kind == Placement.EVERY_RANK)
    ent, owner = _entries(space, options[fixed])
    e, rank = run_ranks(space, ent, space.entry_position[ent])
    ranks.put(rank, x_col[fixed][np.repeat(owner, space.options.repeat[ent])], e)


def _put_host_bound(b: _Builder, ranks: _RankRows, space: SearchSpace, options: np.ndarray,
                    kind: np.ndarray, x_col: np.ndarray) -> np.ndarray:
    """A binary host per host-bound option (one host iff chosen); host-uniform options' loads on
    the host's ranks. The first host column of each option, -1 if none."""
    hosts, lws = space.num_hosts, space.local_world_size
    host_col = np.full(len(options), -1, dtype=np.int64)
    bound_to_host = np.flatnonzero((kind == Placement.HOST_UNIFORM) | (kind == Placement.HOST_FREE))
    if len(bound_to_host):
        first = b.add_cols(len(bound_to_host) * hosts)
        host_col[bound_to_host] = first + hosts * np.arange(len(bound_to_host))
        link = b.add_rows(len(bound_to_host), 0.0, 0.0) + np.arange(len(bound_to_host))
        b.add(link[:, None], host_col[bound_to_host][:, None] + np.arange(hosts), 1.0)
        b.add(link, x_col[bound_to_host], -1.0)
    uniform = np.flatnonzero(kind == Placement.HOST_UNIFORM)
    ent, owner = _entries(space, options[uniform])
    e, local = run_ranks(space, ent, space.entry_position[ent])
    col = host_col[uniform][np.repeat(owner, space.options.repeat[ent])]
    for h in range(hosts if len(uniform) else 0):
        ranks.put(h * lws + local, col + h, e)
    return host_col


@dataclass(frozen=True)
class _Classes:
    option: np.ndarray  # (C,) model option (index into options) of each shard class
    entries: list[np.ndarray]  # (C,) entries of each class
    col: np.ndarray  # (C,) first of len(free_ranks) n columns


def _put_free(b: _Builder, ranks: _RankRows, space: SearchSpace, options: np.ndarray, kind: np.ndarray,
              x_col: np.ndarray, host_col: np.ndarray, free_ranks: np.ndarray) -> _Classes:
    """Free shards: classes of identical shards, counted per allowed rank; every shard of a chosen
    option placed (on its chosen host's ranks, for host-free ones)."""
    lws, f = space.local_world_size, len(free_ranks)
    free = np.flatnonzero((kind == Placement.FREE) | (kind == Placement.HOST_FREE))
    ent, owner = _entries(space, options[free])
    classes, class_of = _classes(space, ent, owner)
    class_option = free[owner[classes]]
    counts = np.bincount(class_of, minlength=len(classes))
    class_col = b.add_cols(len(classes) * f, up=np.repeat(counts, f)) + f * np.arange(len(classes))
    cols = class_col[:, None] + np.arange(f)
    ranks.put(np.broadcast_to(free_ranks, cols.shape).ravel(), cols.ravel(), np.repeat(ent[classes], f))
    host_free = kind[class_option] == Placement.HOST_FREE
    mine = np.flatnonzero(~host_free)
    placed = b.add_rows(len(mine), 0.0, 0.0) + np.arange(len(mine))
    b.add(placed[:, None], cols[mine], 1.0)
    b.add(placed, x_col[class_option[mine]], -counts[mine])
    mine = np.flatnonzero(host_free)
    for h in range(space.num_hosts if len(mine) else 0):
        at = np.flatnonzero(free_ranks // lws == h)
        placed = b.add_rows(len(mine), 0.0, 0.0) + np.arange(len(mine))
        b.add(placed[:, None], cols[mine][:, at], 1.0)
        b.add(placed, host_col[class_option[mine]] + h, -counts[mine])
    return _Classes(class_option, [ent[class_of == c] for c in range(len(classes))], class_col)


def _entries(space: SearchSpace, options: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All entries of ``options`` and the position in ``options`` of each one's owner."""
    starts = space.options.shard_start[options]
    counts = space.options.shard_start[options + 1] - starts
    owner = np.repeat(np.arange(len(options)), counts)
    return np.arange(counts.sum()) + np.repeat(starts - (np.cumsum(counts) - counts), counts), owner


def _classes(space: SearchSpace, ent: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group entries of the same option with equal cost: (first entry of each class, class of
    every entry)."""
    opts = space.options
    if not len(ent):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((ent, opts.ddr[ent], opts.hbm[ent], opts.perf[ent], owner))
    o, p, h, d = owner[order], opts.perf[ent][order], opts.hbm[ent][order], opts.ddr[ent][order]
    new = np.concatenate(([True], (o[1:] != o[:-1]) | (p[1:] != p[:-1]) | (h[1:] != h[:-1]) | (d[1:] != d[:-1])))
    class_sorted = np.cumsum(new) - 1
    class_of = np.empty(len(ent), np.int64)
    class_of[order] = class_sorted
    return order[new], class_of


def start_vector(model: MilpModel, space: SearchSpace, a: Assignment) -> np.ndarray | None:
    """The column values of assignment ``a`` (None if the model cannot express it)."""
    v = np.zeros(model.num_cols)
    where = {int(o): k for k, o in enumerate(model.options)}
    tables = np.unique(space.options.table[model.options])
    picked = [where.get(int(o), -1) for o in a.choice[tables]]
    if min(picked, default=0) < 0:
        return None
    k = np.array(picked, dtype=np.int64)
    v[0] = a.critical_path / model.time_scale
    v[model.x_col[k]] = 1.0
    lws = space.local_world_size
    for kk in k[model.host_col[k] >= 0]:
        first = a.shard_rank[space.options.shard_start[model.options[kk]]]
        v[model.host_col[kk] + first // lws] = 1.0
    column = np.full(space.world_size, -1, np.int64)
    column[model.free_ranks] = np.arange(len(model.free_ranks))
    chosen = np.zeros(len(model.options), bool)
    chosen[k] = True
    for c in np.flatnonzero(chosen[model.class_option]):
        j = column[a.shard_rank[model.class_entries[c]]]
        if (j < 0).any():
            return None
        v[model.class_col[c] + j] += 1.0
    return v


def decode(model: MilpModel, space: SearchSpace, values: np.ndarray, base: Assignment) -> Assignment | None:
    """``base`` with the model's tables as the solution ``values`` has them; None if the
    solution is incomplete or overflows a rank once loads are recomputed exactly."""
    opts = space.options
    x = values[model.x_col] > 0.5
    tables = opts.table[model.options[x]]
    if len(np.unique(tables)) != len(tables) or len(tables) != len(np.unique(opts.table[model.options])):
        return None
    choice, shard_rank = base.choice.copy(), base.shard_rank.copy()
    for o in choice[tables]:
        shard_rank[opts.shards(o)] = -1
    choice[tables] = model.options[x]
    lws, hosts = space.local_world_size, space.num_hosts
    for k in np.flatnonzero(x):
        sl = opts.shards(model.options[k])
        host = 0
        if model.host_col[k] >= 0:
            host = int(np.argmax(values[model.host_col[k]:model.host_col[k] + hosts]))
        shard_rank[sl] = host * lws + space.entry_position[sl]
    f = len(model.free_ranks)
    for c in np.flatnonzero(x[model.class_option]):
        counts = np.rint(values[model.class_col[c]:model.class_col[c] + f]).astype(np.int64)
        entries = model.class_entries[c]
        if counts.sum() != len(entries) or (counts < 0).any():
            return None
        shard_rank[entries] = np.repeat(model.free_ranks, counts)
    a = usage(space, choice, shard_rank)
    if (a.hbm > space.hbm_cap).any() or (a.ddr > space.ddr_cap).any():
        return None
    return a


def distinct(space: SearchSpace, options: np.ndarray) -> np.ndarray:
    """``options`` without those that repeat an earlier option of the same table in the MILP's
    terms: the same shards with the same costs, placed alike (column_wise with one column block
    is table_wise; on one host table_row_wise is row_wise)."""
    opts = space.options
    kind = _placements(space, options).astype(np.int64)
    single = opts.num_shards()[options] == 1
    kind = np.where(single & (kind == Placement.HOST_FREE), Placement.FREE, kind)
    seen, keep = set(), []
    for i, o in enumerate(options):
        sl = opts.shards(int(o))
        key = (int(opts.table[o]), int(kind[i]), opts.perf[sl].tobytes(), opts.hbm[sl].tobytes(),
               opts.ddr[sl].tobytes(), opts.repeat[sl].tobytes(), space.entry_position[sl].tobytes())
        if key not in seen:
            seen.add(key)
            keep.append(int(o))
    return np.array(keep, dtype=np.int64)


@dataclass(frozen=True)
class MilpLimits:
    """What stops HiGHS: branch-and-bound nodes (deterministic) or wall-clock seconds (a cap)."""

    nodes: int
    seconds: float


@dataclass(frozen=True)
class MilpOutcome:
    values: np.ndarray | None  # the best solution's columns, None if none
    objective: float  # its critical path (ms); inf if none
    dual_bound: float  # ms; proven lower bound on the model's optimum (HiGHS's, shaved by its gap)
    status: str  # HiGHS's wording, for people (``optimal`` and ``capped`` are what code reads)
    nodes: int
    iterations: int  # simplex iterations: HiGHS's deterministic measure of work done
    seconds: float
    optimal: bool  # proven optimal (within MIP_REL_GAP)
    capped: bool  # stopped by the wall-clock cap: the result may depend on machine load


MIP_REL_GAP = 1e-6  # HiGHS stops once within this of its bound
# How long past its time limit a HiGHS run is waited for. HiGHS 1.16 can loop where it checks neither
# its clock nor an interrupt callback (a 1691-column model of a stress workload ran for good at a 30 s
# limit, and returned at 10 s): its worker is then killed and the search goes on without its answer.
WATCHDOG_GRACE_S = 10.0


def highs_options(limits: MilpLimits) -> tuple[tuple[str, Any], ...]:
    """The HiGHS options of every run: one thread, a fixed seed, ``limits``, tight tolerances."""
    return (("threads", 1), ("random_seed", 0),
            ("mip_max_nodes", int(limits.nodes)), ("time_limit", float(limits.seconds)),
            ("mip_rel_gap", MIP_REL_GAP), ("mip_abs_gap", 0.0),
            # HiGHS 1.16 can loop for good, past its time limit, restarting a MIP whose
            # integer columns mostly went inactive (a 289-column neighbourhood did).
            ("mip_allow_restart", False),
            # Its root reduced-cost heuristic can too, from a start (a 1,889-column model of
            # memory_tight_bench --third-shapes many_small-3308 ran for good at a 30 s limit, and is
            # optimal in 0.6 s without it: tests/rec/test_milp.py).
            ("mip_heuristic_run_root_reduced_cost", False),
            ("mip_feasibility_tolerance", SOLVER_TOLERANCE),
            ("primal_feasibility_tolerance", SOLVER_TOLERANCE))


def solve(model: MilpModel, limits: MilpLimits, start: np.ndarray | None = None,
          options: dict[str, Any] | None = None) -> MilpOutcome:
    """Solve with HiGHS on one thread with a fixed seed (deterministic until the wall-clock cap),
    in its worker process (``rec.highs``); ``options``: more HiGHS options."""
    import time

    arrays = {name: getattr(model, name) for name in MODEL_ARRAYS}  # MilpModel's fields of those names
    began = time.perf_counter()
    run = HIGHS.run(arrays, (*highs_options(limits), *(options or {}).items()), start,
                    limits.seconds + WATCHDOG_GRACE_S)
    if run is None:
        log.warning("HiGHS gave no answer %g s past its %g-s time limit (%d columns): its run was stopped and "
                    "the search goes on without it", WATCHDOG_GRACE_S, limits.seconds, model.num_cols)
        return MilpOutcome(None, np.inf, 0.0, f"no answer {WATCHDOG_GRACE_S:g} s past its time limit", 0, 0,
                           time.perf_counter() - began, False, True)
    scale = model.time_scale
    # HiGHS prunes nodes within MIP_REL_GAP of its best solution and may then report that
    # solution's value as the bound: only the shaved value is proven.
    dual = run.dual_bound * scale * (1 - MIP_REL_GAP) if np.isfinite(run.dual_bound) else 0.0
    return MilpOutcome(run.values, run.objective * scale if run.status.has_solution else np.inf, dual,
                       run.status.text, run.nodes, run.iterations, run.seconds, run.status.optimal,
                       run.status.timed_out)


def extended(model: MilpModel, cost: np.ndarray, col_lower: np.ndarray, col_upper: np.ndarray,
             row_lower: np.ndarray, row_upper: np.ndarray,
             entries: tuple[np.ndarray, np.ndarray, np.ndarray]) -> MilpModel:
    """``model`` with another objective (``cost`` over old and new columns), continuous columns
    and rows appended; ``entries`` = (rows, cols, values) of the new coefficients, in the new
    numbering (rows and columns of ``model`` keep theirs)."""
    new_cols, new_rows = len(col_lower), len(row_lower)
    old_cols = np.repeat(np.arange(model.num_cols), np.diff(model.start))
    rows = np.concatenate((model.index, entries[0]))
    cols = np.concatenate((old_cols, entries[1]))
    vals = np.concatenate((model.value, entries[2]))
    order = np.lexsort((rows, cols))
    num_cols = model.num_cols + new_cols
    start = np.searchsorted(cols[order], np.arange(num_cols + 1))
    return replace(model, num_cols=num_cols, num_rows=model.num_rows + new_rows, cost=cost,
                   col_lower=np.concatenate((model.col_lower, col_lower)),
                   col_upper=np.concatenate((model.col_upper, col_upper)),
                   integer=np.concatenate((model.integer, np.zeros(new_cols, bool))),
                   row_lower=np.concatenate((model.row_lower, row_lower)),
                   row_upper=np.concatenate((model.row_upper, row_upper)),
                   start=start, index=rows[order], value=vals[order])
