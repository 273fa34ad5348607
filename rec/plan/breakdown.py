"""Where each table sits, and what each rank's estimated time is made of: compute and communication.

The cost model (``rec.cost``) gives one time per shard. Its communication part is the part that
depends on the network: the same estimate with infinitely fast links (``intra_host_bw`` and
``inter_host_bw``) is the compute part (lookups, memory traffic, optimizer kernels), and the rest is
communication (all-to-all, reduce-scatter, all-gather, all-reduce). The plan is re-estimated from
its own spec rows, topology and cost configuration, so plan.json is all it needs; the parts add up
to the plan's per-rank estimates (``metrics.rank_perf``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from rec.cost.enumerator import enumerate_options
from rec.cost.types import Options
from rec.errors import InputError, Problem
from rec.plan.load_factors import chosen_load_factors, unstated_caches
from rec.plan.types import Plan, Replicas
from rec.sharding import CK_CODE, ST_CODE


@dataclass(frozen=True)
class Breakdown:
    """One entry per shard of the plan; a data_parallel table has one entry standing for its
    replica on every rank (``rank`` -1)."""

    table: np.ndarray  # (N,) index into plan.tables
    rank: np.ndarray  # (N,) -1: a replica on every rank
    shard: np.ndarray  # (N,) position among the table's shards
    compute_ms: np.ndarray  # (N,)
    comm_ms: np.ndarray  # (N,)
    hbm: np.ndarray  # (N,) bytes
    ddr: np.ndarray  # (N,) bytes
    world_size: int

    def rank_compute(self) -> np.ndarray:
        return self._per_rank(self.compute_ms)

    def rank_comm(self) -> np.ndarray:
        return self._per_rank(self.comm_ms)

    def _per_rank(self, values: np.ndarray) -> np.ndarray:
        placed = self.rank >= 0
        out: np.ndarray = np.bincount(self.rank[placed], weights=values[placed], minlength=self.world_size)
        return out + float(values[~placed].sum())

    def on_rank(self, rank: int) -> np.ndarray:
        """Indices of the entries on ``rank`` (replicas included)."""
        return np.flatnonzero((self.rank == rank) | (self.rank < 0))


def breakdown(plan: Plan) -> Breakdown:
    """Every shard's compute and communication time under the plan's own cost model."""
    spec, topology, cost = plan.spec, plan.topology, plan.planner.cost
    sizes = chosen_load_factors(plan)  # the caches at the sizes the plan chose
    unstated = unstated_caches(plan)  # the caches it gives no size
    total = enumerate_options(spec, topology, cost, sizes, unstated=unstated)
    free = enumerate_options(spec, replace(topology, intra_host_bw=math.inf, inter_host_bw=math.inf),
                             replace(cost, profile=cost.profile.without_network()), sizes,
                             unstated=unstated)
    index = {t.key: i for i, t in enumerate(spec.tables)}
    keys = _option_keys(total)
    cols: dict[str, list[float]] = {k: [] for k in ("table", "rank", "shard", "compute", "comm", "hbm", "ddr")}
    problems = []
    for ti, t in enumerate(plan.tables):
        o = keys.get((index[t.key], ST_CODE[t.sharding_type], CK_CODE[t.compute_kernel]))
        if o is None:
            problems.append(Problem(f"table {t.key}", "its sharding type and kernel are no option of the cost model"))
            continue
        sl = total.shards(o)
        if isinstance(t.shards, Replicas):
            placed = [(-1, 0, sl.start)]
        else:
            entry = _entries_by_offset(total, sl)
            placed = [(s.rank, k, entry.get((s.offsets[0], s.offsets[1]), -1)) for k, s in enumerate(t.shards)]
            if any(e < 0 for _, _, e in placed):
                problems.append(Problem(f"table {t.key}", "its shards are not those the cost model lays out"))
                continue
        for rank, k, e in placed:
            compute = float(free.perf[e])
            cols["table"].append(ti)
            cols["rank"].append(rank)
            cols["shard"].append(k)
            cols["compute"].append(compute)
            cols["comm"].append(float(total.perf[e]) - compute)
            cols["hbm"].append(int(total.hbm[e]))
            cols["ddr"].append(int(total.ddr[e]))
    if problems:
        raise InputError(f"Cannot break plan {plan.plan_id} down (planned with another cost model?):", problems)
    return Breakdown(np.asarray(cols["table"], dtype=np.int64), np.asarray(cols["rank"], dtype=np.int64),
                     np.asarray(cols["shard"], dtype=np.int64), np.asarray(cols["compute"], dtype=float),
                     np.asarray(cols["comm"], dtype=float), np.asarray(cols["hbm"], dtype=np.int64),
                     np.asarray(cols["ddr"], dtype=np.int64), plan.world_size)


def _option_keys(options: Options) -> dict[tuple[int, int, int], int]:
    return {(int(t), int(st), int(ck)): o for o, (t, st, ck) in
            enumerate(zip(options.table, options.sharding_type, options.compute_kernel, strict=True))}


def _entries_by_offset(options: Options, sl: slice) -> dict[tuple[int, int], int]:
    """(row offset, col offset) of every shard of one option -> its entry (run) index."""
    out = {}
    for e in range(sl.start, sl.stop):
        for k in range(int(options.repeat[e])):
            out[(int(options.row_offset[e] + k * options.row_step[e]), int(options.col_offset[e]))] = e
    return out
