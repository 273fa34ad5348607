"""Every option TorchRec's ``EmbeddingEnumerator`` would produce, with its shard estimates.

The reference is TorchRec 1.8's ``EmbeddingEnumerator(topology, batch_size, constraints,
estimator=[EmbeddingPerfEstimator, EmbeddingStorageEstimator])`` enumerating an
model holding the spec's modules (an ``EmbeddingBagCollection`` per pooled module, an
``EmbeddingCollection`` per unpooled one, at their paths) with the default
``EmbeddingBagCollectionSharder()`` and ``EmbeddingCollectionSharder()`` (see ``rec.cost.tables`` for
how a table maps to TorchRec's config and constraints). Every module's tables are rated on the same
ranks; a table's module only decides what its sharder offers and whether its outputs are pooled.

What the sharders offer (``sharding_types`` / ``compute_kernels``; ``rec.sharding.sharder_options``):

* EmbeddingBagCollectionSharder, cpu: data_parallel (dense) and table_wise, column_wise,
  table_column_wise (fused); cuda: data_parallel (dense) and table_wise, column_wise,
  table_column_wise, row_wise, table_row_wise (fused, fused_uvm, fused_uvm_caching).
* EmbeddingCollectionSharder, cpu and cuda: data_parallel (dense) and table_wise, column_wise,
  row_wise (fused; on cuda also fused_uvm, fused_uvm_caching); on cpu without data_parallel
  (a deviation, below).
* grid_shard and key_value are never enumerated (``rec.sharding.NOT_PLANNED``; spec validation
  refuses them): TorchRec enumerates grid_shard only when allow-listed, and drops key_value when no
  rank has SSD, which shardflow's Topology never has (= a torchrec Topology with ``ssd_cap=0``).

Deliberate deviations (asserted in tests/rec/test_cost.py and test_cost_ec.py):

* Where TorchRec raises RuntimeError because a table's allow-lists leave no option, this raises
  ``InputError`` naming every such table.
* Options are ordered by table, then sharding-type code, then kernel code (TorchRec: module order,
  then the sharder's order); the set of options is the same.
* Shards are run-length encoded (``Options.expand()`` gives TorchRec's per-shard list).
* On cpu, an EmbeddingCollection's data_parallel option is left out: TorchRec enumerates it, but
  its dense kernel there returns one row per bag instead of one per id and training fails
  (TorchRec issue 1255).
* On cuda, options FBGEMM's kernels refuse at training time are left out: shards wider than
  ``CUDA_MAX_SHARD_DIM`` columns, and data_parallel (the dense kernel) for a dim that is not a
  multiple of ``CUDA_DIM_MULTIPLE``; TorchRec enumerates them and the job then fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from rec.config.cost import CostConfig
from rec.cost.bandwidth import kernel_bw, links
from rec.cost.constants import CUDA_DIM_MULTIPLE, CUDA_MAX_SHARD_DIM
from rec.cost.perf import shard_perf
from rec.cost.shards import layout
from rec.cost.storage import kernel_storage, storage_parts
from rec.cost.tables import TableArrays, table_arrays
from rec.cost.types import Options
from rec.errors import InputError, Problem, ProblemList
from rec.sharding import CK_CODE, ST_CODE, ComputeDevice, ComputeKernel, ModuleKind, ShardingType, sharder_options
from rec.spec.types import Spec, TableSpec
from rec.topology.types import Topology


def enumerate_options(
    spec: Spec, topology: Topology, config: CostConfig = CostConfig(), load_factors: np.ndarray | None = None,
    *, unstated: np.ndarray | None = None,
) -> Options:
    """All options of all tables with per-shard ``Perf.total``, HBM and DDR, as TorchRec's;
    ``load_factors`` (spec order, NaN: none) are cache sizes a plan chose (``rec.cost.tables``);
    ``unstated``: (T,) the caches a plan gives no size (``rec.cost.tables.table_arrays``)."""
    cols = table_arrays(spec, topology.batch_size, config, load_factors, world_size=topology.world_size,
                        unstated=unstated)
    offered = cols.offered(topology.compute_device)
    blocks: list[_Block] = []
    for st, kernels in _union(cols.kinds, topology.compute_device).items():
        codes = [CK_CODE[ck] for ck in kernels]
        st_ok = cols.sharding_allowed[:, ST_CODE[st]]
        ck_ok = st_ok[:, None] & cols.kernel_allowed[:, codes] & offered[:, ST_CODE[st]][:, codes]
        tab = np.flatnonzero(ck_ok.any(axis=1))
        if len(tab):
            blocks += _blocks(st, kernels, tab, ck_ok[tab], cols, topology, config)
    _check_every_table_has_options(spec, blocks, topology.compute_device)
    return _assemble(blocks)


def _union(kinds: tuple[ModuleKind, ...], device: ComputeDevice) -> dict[ShardingType, tuple[ComputeKernel, ...]]:
    """What any of the sharders of ``kinds`` offers on ``device`` (each table is then held to its own's)."""
    union: dict[ShardingType, tuple[ComputeKernel, ...]] = {}
    for kind in kinds:
        for st, kernels in sharder_options(device, kind).items():
            known = set(union.get(st, ())) | set(kernels)
            union[st] = tuple(ck for ck in ComputeKernel if ck in known)
    return union


@dataclass(frozen=True)
class _Block:
    """Options of one (sharding type, kernel): one per table in ``table``, runs grouped by it."""

    table: np.ndarray
    st: int
    ck: int
    count: np.ndarray  # runs per option
    runs: dict[str, np.ndarray]  # the per-run fields of Options


def _blocks(
    st: ShardingType,
    kernels: tuple[ComputeKernel, ...],
    tab: np.ndarray,
    kernel_ok: np.ndarray,
    cols: TableArrays,
    topology: Topology,
    config: CostConfig,
) -> list[_Block]:
    """Options of one sharding type, one block per kernel, for the tables ``tab``."""
    lay = layout(st, cols.rows[tab], cols.dims[tab], topology.world_size, topology.local_world_size,
                 cols.min_partition[tab])
    if topology.compute_device is ComputeDevice.CUDA:
        usable = np.maximum.reduceat(lay.cols, np.cumsum(lay.count) - lay.count) <= CUDA_MAX_SHARD_DIM
        if st is ShardingType.DATA_PARALLEL:
            usable &= cols.dims[tab] % CUDA_DIM_MULTIPLE == 0
        kernel_ok = kernel_ok & usable[:, None]
    t = tab[lay.owner]  # table of every run
    parts = storage_parts(
        st,
        topology.world_size,
        topology.local_world_size,
        cols.load_factor[t],
        cols.rows[t],
        cols.dims[t],
        cols.elem[t],
        cols.optimizer_multiplier[t],
        lay.rows,
        lay.cols,
        cols.batch_inputs[t],
        cols.batch_outputs[t],
        with_cache=ComputeKernel.FUSED_UVM_CACHING in kernels,
        pooled=cols.pooled[t],
    )
    blocks = []
    hw = links(topology, config.profile)
    for j, ck in enumerate(kernels):
        # The perf estimator passes the cache load factor through as is (0.0 stays 0.0).
        perf = shard_perf(
            st,
            ck,
            topology,
            config.profile,
            hw,
            kernel_bw(hw, config.profile, ck, cols.load_factor[t]),
            lay.rows,
            lay.cols,
            cols.elem[t],
            cols.batch_inputs[t],
            cols.priced_outputs[t],
            pooled=cols.pooled[t],
            miss_rate=cols.miss_rate[t],
            cache_fetches=cols.cache_fetches[t],
            weighted=cols.weighted[t],
        ).total
        hbm, ddr = kernel_storage(parts, ck, topology.compute_device)
        runs = {
            "perf": perf,
            "hbm": hbm,
            "ddr": ddr,
            "row_offset": lay.row_offset,
            "col_offset": lay.col_offset,
            "rows": lay.rows,
            "cols": lay.cols,
            "repeat": lay.repeat,
            "row_step": lay.row_step,
        }
        ok = kernel_ok[:, j]
        count = lay.count
        if not ok.all():  # a kernel allow-list excludes this kernel for some tables
            keep = ok[lay.owner]
            runs = {k: v[keep] for k, v in runs.items()}
            count = count[ok]
        if len(count):
            blocks.append(_Block(tab[ok], ST_CODE[st], CK_CODE[ck], count, runs))
    return blocks


class NoOptionLeft(InputError):
    """Tables (``tables``: their indexes in the spec) that have no sharding option on the topology."""

    def __init__(self, title: str, problems: list[Problem], tables: np.ndarray) -> None:
        super().__init__(title, problems)
        self.tables = tables


def _check_every_table_has_options(spec: Spec, blocks: list[_Block], device: ComputeDevice) -> None:
    """TorchRec raises RuntimeError for the first such table; report them all as user errors."""
    covered = np.zeros(len(spec.tables), dtype=bool)
    for b in blocks:
        covered[b.table] = True
    problems = ProblemList()
    for i in np.flatnonzero(~covered):
        t = spec.tables[i]
        offers = sharder_options(device, t.pooling.module_kind)
        for rule in _device_rules(t, device):  # a line each: one line cut at its end lost what the table can be
            problems.add(f"table {t.key}", rule)
        problems.add(f"table {t.key}", f"no sharding type and compute kernel left after its allow-lists "
                                        f"(sharding_types={_names(t.sharding_types)}, "
                                        f"compute_kernels={_names(t.compute_kernels)})")
        problems.add(f"table {t.key}", f"on {device.value} a table of an {t.pooling.module_kind.value} can be "
                                        f"{_offers(offers)}")
    if problems:
        raise NoOptionLeft("Some tables have no sharding option on this topology", problems.items,
                           np.flatnonzero(~covered))


def _device_rules(t: TableSpec, device: ComputeDevice) -> list[str]:
    """What FBGEMM's kernels refuse of the table on ``device``, which the options left out."""
    if device is not ComputeDevice.CUDA:
        return []
    rules = []
    if t.embedding_dim % CUDA_DIM_MULTIPLE:
        rules.append(f"its embedding_dim {t.embedding_dim} is no multiple of {CUDA_DIM_MULTIPLE}, which FBGEMM's "
                     "kernels on cuda need (data_parallel's dense one too)")
    if t.embedding_dim > CUDA_MAX_SHARD_DIM:
        rules.append(f"FBGEMM's kernels on cuda take shards of at most {CUDA_MAX_SHARD_DIM:,} columns, and only "
                     f"column_wise and table_column_wise split its {t.embedding_dim:,}")
    return rules


def _offers(options: dict[ShardingType, tuple[ComputeKernel, ...]]) -> str:
    """``table_wise, row_wise (fused, fused_uvm)``: the sharding types of the same kernels together."""
    of_kernels: dict[tuple[ComputeKernel, ...], list[str]] = {}
    for st, kernels in options.items():
        of_kernels.setdefault(kernels, []).append(st.value)
    return "; ".join(f"{', '.join(types)} ({', '.join(ck.value for ck in kernels)})"
                     for kernels, types in of_kernels.items())


def _names(values: tuple[StrEnum, ...] | None) -> str:
    return "any" if not values else ",".join(v.value for v in values)


_RUN_DTYPES = {
    "perf": np.float64,
    "hbm": np.int64,
    "ddr": np.int64,
    "row_offset": np.int64,
    "col_offset": np.int64,
    "rows": np.int64,
    "cols": np.int64,
    "repeat": np.int32,
    "row_step": np.int64,
}


def _assemble(blocks: list[_Block]) -> Options:
    """Concatenate blocks and order options by (table, sharding type, kernel), runs along."""
    def cat(arrays: list[npt.ArrayLike], dtype: npt.DTypeLike) -> np.ndarray:
        return np.concatenate(arrays or [[]]).astype(dtype)

    table = cat([b.table for b in blocks], np.int32)
    st = cat([np.full(len(b.table), b.st) for b in blocks], np.int8)
    ck = cat([np.full(len(b.table), b.ck) for b in blocks], np.int8)
    count = cat([b.count for b in blocks], np.int64)
    order = np.lexsort((ck, st, table))

    old_start = np.cumsum(count) - count
    new_count = count[order]
    new_start = np.concatenate(([0], np.cumsum(new_count))).astype(np.int64)
    # Run k of new option i is run old_start[order[i]] + k of the concatenated blocks.
    run = np.repeat(old_start[order] - new_start[:-1], new_count) + np.arange(new_start[-1])
    fields = {f: cat([b.runs[f] for b in blocks], dtype)[run] for f, dtype in _RUN_DTYPES.items()}
    return Options(
        table=table[order],
        sharding_type=st[order],
        compute_kernel=ck[order],
        shard_start=new_start,
        **fields,
    )
