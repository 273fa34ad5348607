"""Explain, per table, why nothing fits, and by how much."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rec.config.cost import CostConfig
from rec.cost import enumerate_options
from rec.errors import InputError, Problem, ProblemList
from rec.search.space import SearchSpace, build_space
from rec.sharding import COMPUTE_KERNELS, SHARDING_TYPES, ComputeDevice, ComputeKernel, ShardingType
from rec.spec.types import Spec, TableSpec
from rec.topology.types import MAX_CLUSTER_BYTES, MAX_SAMPLES_PER_STEP, MAX_WORLD_SIZE, Topology
from rec.units import format_bytes


def check_capacity_left(space: SearchSpace, topology: Topology) -> None:
    """TorchRec reserves memory for every feature's input batch before any table; when that
    leaves a rank nothing, say so once rather than failing every table."""
    cuda = topology.compute_device is ComputeDevice.CUDA
    kind, cap = ("HBM", space.hbm_cap) if cuda else ("DDR", space.ddr_cap)
    if cap.max() > 0:
        return
    # On cpu the reservation's percentage is of HBM, which cpu ranks have none of: only the inputs come off DDR.
    reserved = f"the storage reservation ({topology.storage_reservation:.0%} of HBM) and " if cuda else ""
    tables = f"{space.num_tables:,} table{'s' if space.num_tables != 1 else ''}"
    raise InputError("The topology has no memory left for embedding tables:", [Problem(
        f"topology {kind.lower()}_cap", f"{format_bytes(topology.hbm_cap if cuda else topology.ddr_cap)} per rank: "
                                        f"after {reserved}the input buffers of {tables} at batch_size "
                                        f"{topology.batch_size} (TorchRec's HeuristicalStorageReservation "
                                        f"takes them off {kind} on {topology.compute_device.value}), each rank has "
                                        f"{format_bytes(cap.max())} {kind}; lower batch_size or pooling factors, "
                                        f"or give ranks more {kind}")])


def check_every_table_fits(space: SearchSpace, spec: Spec, topology: Topology,
                           cost: CostConfig = CostConfig()) -> None:
    """Raise one InputError naming every table none of whose options fits a rank, by how much, and
    what would make it fit."""
    opts = space.options
    has = np.zeros(space.num_tables, dtype=bool)
    has[opts.table[space.feasible]] = True
    if has.all():
        return
    shard_max_hbm = opts.largest(opts.hbm)
    shard_max_ddr = opts.largest(opts.ddr)
    hbm_cap, ddr_cap = int(space.hbm_cap.max()), int(space.ddr_cap.max())
    unfit = [int(t) for t in np.flatnonzero(~has) if (opts.table == t).any()]
    hints = dict(zip(unfit, _hints([spec.tables[t] for t in unfit], topology, cost, hbm_cap, ddr_cap), strict=True))
    problems = ProblemList()
    for t in np.flatnonzero(~has):
        mine = np.flatnonzero(opts.table == t)
        if not len(mine):
            problems.add(f"table {spec.tables[t].key}",
                         "no sharding option is allowed on this topology "
                         "(check sharding_types / compute_kernels against the compute device)")
            continue
        over = np.maximum(shard_max_hbm[mine] - hbm_cap, shard_max_ddr[mine] - ddr_cap)
        o = mine[int(np.argmin(over))]
        st = SHARDING_TYPES[opts.sharding_type[o]].value
        ck = COMPUTE_KERNELS[opts.compute_kernel[o]].value
        kind, need, cap = (("HBM", shard_max_hbm[o], hbm_cap) if shard_max_hbm[o] > hbm_cap
                           else ("DDR", shard_max_ddr[o], ddr_cap))
        note, helps = hints[int(t)]
        helps = [*helps, _more_memory(shard_max_hbm[mine], shard_max_ddr[mine], hbm_cap, ddr_cap)]
        problems.add(f"table {spec.tables[t].key}",
                     f"does not fit: its best option ({st}/{ck}) needs {format_bytes(need)} {kind} on one "
                     f"rank, {format_bytes(cap)} available (over by {format_bytes(need - cap)}); "
                     f"{note}it would fit {', or '.join(helps)}")
    problems.raise_if_any("The spec does not fit the topology:")


@dataclass(frozen=True)
class _Fit:
    """An option of a table that fits on ``world`` ranks."""

    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    world: int


def _more_memory(hbm: np.ndarray, ddr: np.ndarray, hbm_cap: int, ddr_cap: int) -> str:
    """Ranks with how much memory would hold one of a table's options (largest shards ``hbm``,
    ``ddr``): the least HBM with DDR as it is, the least DDR with HBM as it is, else both."""
    more = {kind: format_bytes(int(need[fits].min())) for kind, need, fits in
            (("HBM", hbm, ddr <= ddr_cap), ("DDR", ddr, hbm <= hbm_cap)) if fits.any()}
    if not more:
        o = int(np.argmin(np.maximum(hbm - hbm_cap, ddr - ddr_cap)))
        return f"on ranks with {format_bytes(int(hbm[o]))} of usable HBM and {format_bytes(int(ddr[o]))} of usable DDR"
    if len(set(more.values())) == 1:
        return f"on ranks with {next(iter(more.values()))} of usable {' or '.join(more)}"
    return "on ranks with " + " or ".join(f"{need} of usable {kind}" for kind, need in more.items())


def _hints(tables: list[TableSpec], topology: Topology, cost: CostConfig, hbm_cap: int,
           ddr_cap: int) -> list[tuple[str, list[str]]]:
    """Per table, besides bigger ranks: (a note, how else it would fit). It would fit with an
    option its allow-lists exclude; on more ranks of this size where they shrink its shards enough
    (row_wise shards shrink as ranks are added, table_wise and column_wise ones do not: such a
    table needs bigger ranks), with how many; or both. The note says when no number of ranks of
    this size, up to the largest topology shardflow takes, holds it as its allow-lists stand."""
    lifted = [replace(t, sharding_types=None, compute_kernels=None) for t in tables]
    limited = [i for i, t in enumerate(tables) if t.sharding_types or t.compute_kernels]
    allowed = dict(zip(limited, _fitting([lifted[i] for i in limited], topology, cost, topology.world_size,
                                         hbm_cap, ddr_cap, [tables[i] for i in limited]), strict=True))
    more = _fewest_ranks(tables, topology, cost, hbm_cap, ddr_cap, tables)
    unhelped = [i for i in limited if allowed[i] is None]
    more_lifted = dict(zip(unhelped, _fewest_ranks([lifted[i] for i in unhelped], topology, cost, hbm_cap, ddr_cap,
                                                   [tables[i] for i in unhelped]), strict=True))
    out = []
    for i, table in enumerate(tables):
        helps, note = [], ""
        allowing, own, lifting = allowed.get(i), more[i], more_lifted.get(i)
        if allowing is not None:
            helps.append(f"with {_lifting(table, allowing)} allowed")
        if own is not None:
            helps.append(f"on {own.world:,} ranks of this size ({own.sharding_type.value})")
        if lifting is not None and (own is None or lifting.world < own.world):
            helps.append(f"on {lifting.world:,} ranks of this size with {_lifting(table, lifting)} allowed")
        if own is None and lifting is None and _most_ranks(topology) > topology.world_size:
            note = "more ranks of this size cannot hold it; "
        out.append((note, helps))
    return out


def _lifting(table: TableSpec, fit: _Fit) -> str:
    """What of ``fit`` the table's allow-lists leave out, in words."""
    return " and ".join(_excluded(table, fit))


def _excluded(table: TableSpec, fit: _Fit) -> list[str]:
    out = []
    if table.sharding_types and fit.sharding_type not in table.sharding_types:
        out.append(f"{fit.sharding_type.value} sharding")
    if table.compute_kernels and fit.compute_kernel not in table.compute_kernels:
        out.append(f"the {fit.compute_kernel.value} kernel")
    return out


def _most_ranks(topology: Topology) -> int:
    """The largest world size of whole hosts like these that a topology may have."""
    largest_cap = max(topology.hbm_cap, topology.ddr_cap, 1)
    most = min(MAX_WORLD_SIZE, MAX_SAMPLES_PER_STEP // topology.batch_size, MAX_CLUSTER_BYTES // largest_cap)
    return most // topology.local_world_size * topology.local_world_size


def _fewest_ranks(tables: list[TableSpec], topology: Topology, cost: CostConfig, hbm_cap: int, ddr_cap: int,
                  prefer: list[TableSpec]) -> list[_Fit | None]:
    """Per table, an option that fits on the fewest ranks of this size beyond the topology's (whole
    hosts of ``local_world_size``), or None if none fits up to ``_most_ranks``. Host counts double
    until one fits, then bisect (a table's largest shard need not shrink monotonically: io buffers
    grow with the ranks, so this is a count that fits, not always the least one)."""
    lws = topology.local_world_size
    now, most = topology.world_size // lws, _most_ranks(topology) // lws
    ladder = []
    hosts = now * 2
    while hosts < most:
        ladder.append(hosts)
        hosts *= 2
    ladder += [most] if most > now else []
    low, high = [now] * len(tables), [0] * len(tables)  # hosts known not to fit; that fit (0: none yet)
    found: list[_Fit | None] = [None] * len(tables)
    pending = list(range(len(tables)))
    for hosts in ladder:
        if not pending:
            break
        fits = _fitting([tables[i] for i in pending], topology, cost, hosts * lws, hbm_cap, ddr_cap,
                        [prefer[i] for i in pending])
        for i, fit in zip(pending, fits, strict=True):
            low[i], high[i], found[i] = (low[i], hosts, fit) if fit else (hosts, 0, None)
        pending = [i for i in pending if found[i] is None]
    for _ in range(_BISECTIONS):
        by_mid: dict[int, list[int]] = {}
        for i in range(len(tables)):
            if high[i] - low[i] > 1:
                by_mid.setdefault((low[i] + high[i]) // 2, []).append(i)
        if not by_mid:
            break
        for mid, members in by_mid.items():
            fits = _fitting([tables[i] for i in members], topology, cost, mid * lws, hbm_cap, ddr_cap,
                            [prefer[i] for i in members])
            for i, fit in zip(members, fits, strict=True):
                if fit is None:
                    low[i] = mid
                else:
                    high[i], found[i] = mid, fit
    return found


_BISECTIONS = 17  # host counts up to 2**16 need 16 halvings


def _fitting(tables: list[TableSpec], topology: Topology, cost: CostConfig, world: int, hbm_cap: int,
             ddr_cap: int, prefer: list[TableSpec]) -> list[_Fit | None]:
    """Per table, its option that fits on ``world`` ranks with these capacities, if any: the one
    ``prefer`` (the table as the user wrote it) allows, else the one with the fewest of its
    allow-lists lifted; then the least work."""
    if not tables:
        return []
    at = replace(topology, world_size=world)
    options = enumerate_options(Spec(tuple(tables), ""), at, cost)
    space = build_space(options, len(tables), world, at.local_world_size, np.full(world, hbm_cap),
                        np.full(world, ddr_cap))
    best: dict[int, tuple[tuple[int, float], _Fit]] = {}
    for o in np.flatnonzero(space.feasible):
        t = int(options.table[o])
        fit = _Fit(SHARDING_TYPES[options.sharding_type[o]], COMPUTE_KERNELS[options.compute_kernel[o]], world)
        rank = (len(_excluded(prefer[t], fit)), float(space.work[o]))
        if t not in best or rank < best[t][0]:
            best[t] = (rank, fit)
    return [best[t][1] if t in best else None for t in range(len(tables))]


def packing_failure(space: SearchSpace, spec: Spec, tables: list[int]) -> InputError:
    """The error for tables that fit one by one but not together."""
    names = ", ".join(spec.tables[t].key for t in tables[:10])
    more = f" and {len(tables) - 10} more" if len(tables) > 10 else ""
    if space.hbm_cap.sum() > 0:
        # the cache kernel is worth naming only where an allow-list leaves it out
        cache = ComputeKernel.FUSED_UVM_CACHING
        capped = [spec.tables[t].key for t in tables if cache not in (spec.tables[t].compute_kernels or (cache,))]
        caching = f"allow fused_uvm_caching for {', '.join(capped[:5])}{', ...' if len(capped) > 5 else ''}, " \
            if capped else ""
        memory = (f"usable HBM {format_bytes(space.hbm_cap.sum())} and DDR {format_bytes(space.ddr_cap.sum())} "
                  f"over all ranks; {caching}lower storage_reservation, or add ranks or memory")
    else:  # cpu ranks: their memory is DDR (no reservation comes off it), and no kernel caches
        memory = f"usable memory (ddr_cap) {format_bytes(space.ddr_cap.sum())} over all ranks; add ranks or memory"
    return InputError(
        "The tables fit one by one but not all together within the ranks' memory:",
        [Problem(f"tables {names}{more}", f"could not be placed; {memory}")],
    )
