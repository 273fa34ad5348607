"""The plans ``shardflow calibrate`` measures: small specs, each varying one thing the cost model
depends on, so that every number the fit estimates (``rec.calibrate.fit``) is pinned down.

Each probe holds identical tables of one or more sharding types (an allow-list per table), in a
number the ranks share evenly, so every rank carries the same shards and the iteration time is
every rank's time. Per sharding type the device's EmbeddingBagCollection sharder offers, probes
vary the tables per rank (``fixed_ms`` against the plan-level terms), the dim (bytes looked up
against ids read), the pooling factor (lookups against outputs, which the collectives move), the
batch, the ids per sample at the same bytes (pooling factor up, dim down), and the rows against the
ids a batch sends (distinct rows; data_parallel's all-reduce).
A probe of another type than table_wise holds a table_wise ``COMPANION`` too, as plans do: so
each type's ``sharding_type_ms`` is what it adds to a plan that has table_wise's collectives
already (``iteration_ms`` carries table_wise's own). On cuda the other kernels get a probe of their
own, and fused_uvm_caching tables of a fixed cache size (``CACHE_PROBES``) vary its size and the
ids' skew, so that its misses (``cache_miss_multiplier``) are told apart from its lookups. Per
type, one probe splits its tables over two further embedding modules (``module_sharding_type_ms``). The
sizes stay small: a full calibration of 2 cpu ranks measures about 60 probes and holds at
most about 500 MB per rank. On cuda every probe's batch is up to ``BATCH_SCALE`` times larger, at
most ``MAX_PROBE_IDS`` ids per rank and batch: on a GPU a batch of 512 looks its rows up far below
the fixed cost of an iteration, and probes much smaller than the workloads GPUs train leave the fit
to extrapolate the byte terms (bench/RESULTS.md §6-7 measures both); at up to 1,024 times they span
the workloads' range.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from rec.config.cost import CostConfig
from rec.config.search import SearchConfig
from rec.errors import InputError
from rec.plan.types import Plan
from rec.profile.types import DEFAULT_PROFILE
from rec.sharding import ComputeDevice, ComputeKernel, ShardingType, sharder_options
from rec.topology.types import Topology

TW, CW, TCW, DP = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE,
                   ShardingType.DATA_PARALLEL)
RW, TWRW = ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE
PROBE_SEARCH = SearchConfig(time_limit_s=0.0)  # identical tables: the heuristic spreads them evenly
BATCH_SCALE = {ComputeDevice.CPU: 1, ComputeDevice.CUDA: 1024}  # probe batch sizes per device, at most
MAX_PROBE_IDS = 50_000_000  # ids per rank and batch: the synthetic batches and the sort buffers stay a few GB
MAX_PROBE_OUTPUT_BYTES = 2 << 30  # pooled outputs per rank and batch (and as much again for their gradients)
# fused_uvm reads every row over the host link (tens of GB/s, not TB/s): a smaller batch keeps its
# probes from dominating the calibration's time, and still far above the GPU's fixed costs.
UVM_BATCH_DIVISOR = 8


@dataclass(frozen=True)
class Tables:
    """A group of identical tables; ``per_rank`` shards of them on every rank (data_parallel: tables)."""

    sharding_type: ShardingType
    per_rank: int = 2
    rows: int = 100_000
    dim: int = 64
    pooling_factor: float = 4.0
    kernel: ComputeKernel | None = None  # None: the sharding type's first kernel on the device
    cache_load_factor: float | None = None  # a fused_uvm_caching cache of this size, fixed (the planner grows none)
    hit_rate_curve: tuple[tuple[float, float], ...] | None = None  # the ids' skew; None: the skew model
    module: str | None = None  # the embedding module holding them; None: the spec's default one

    @property
    def misses(self) -> bool:
        """Its lookups come over the host link, all (fused_uvm) or a cache's misses."""
        return self.kernel is ComputeKernel.FUSED_UVM or self.cache_load_factor is not None


# Beside every probe of another sharding type: plans mix table_wise with the others (their
# collectives interact), so each type's cost is measured where plans have it. A probe of a type
# alone would see a plan without table_wise's collectives, which plans seldom are.
COMPANION = Tables(TW, per_rank=1)


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    groups: tuple[Tables, ...]
    batch_size: int = 512
    rows: tuple[dict[str, Any], ...] = ()  # a mixed probe's own spec rows (no groups), planned freely
    scaled: bool = True  # False: the batch as given on every device (BATCH_SCALE not applied)


@dataclass(frozen=True)
class Probe:
    name: str
    plan: Plan


# (name, batch size, Tables fields) per sharding type family; QUICK names the quick subset. Rows are
# varied against the ids a batch sends to a table (pooling factor x batch x ranks): far fewer ids
# than rows (every id a distinct row), and far more (the batch keeps hitting the same rows).
_LOOKUP_SWEEP: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("", 512, {}),
    ("tables1", 512, {"per_rank": 1}),
    ("tables8", 512, {"per_rank": 8}),
    ("tables24", 512, {"per_rank": 24, "rows": 10_000}),
    ("dim8", 512, {"dim": 8}),
    ("dim16", 512, {"dim": 16}),
    ("dim32", 512, {"dim": 32}),
    ("dim128", 512, {"dim": 128}),
    ("dim256", 512, {"dim": 256}),
    ("pf1", 512, {"pooling_factor": 1.0}),
    ("pf16", 512, {"pooling_factor": 16.0}),
    ("pf48", 512, {"pooling_factor": 48.0}),
    ("pf16_dim16", 512, {"pooling_factor": 16.0, "dim": 16}),  # the base's bytes in 4 times the ids
    ("batch128", 128, {}),
    ("batch2048", 2048, {}),
    ("batch4096", 4096, {}),
    ("rows1k", 512, {"rows": 1_000}),
    ("rows10k", 512, {"rows": 10_000}),
    ("rows1m", 512, {"rows": 1_000_000, "dim": 32}),
    ("rows4m", 512, {"rows": 4_000_000, "dim": 16, "per_rank": 1}),
    ("rows1k_pf48_batch2048", 2048, {"rows": 1_000, "pooling_factor": 48.0}),
    ("rows4m_pf32_batch1024", 1024, {"rows": 4_000_000, "dim": 16, "per_rank": 1, "pooling_factor": 32.0}),
    ("rows1m_pf8_batch2048", 2048, {"rows": 1_000_000, "dim": 32, "pooling_factor": 8.0}),
    ("tables8_rows10k_dim128_pf16", 512, {"per_rank": 8, "rows": 10_000, "dim": 128, "pooling_factor": 16.0}),
    ("tables16_dim32_pf1_batch256", 256, {"per_rank": 16, "dim": 32, "pooling_factor": 1.0}),
    ("tables48_rows20k_dim32_pf8_batch128", 128, {"per_rank": 48, "rows": 20_000, "dim": 32, "pooling_factor": 8.0}),
    ("rows100k_pf48_batch4096", 4096, {"pooling_factor": 48.0, "dim": 16, "per_rank": 1}),
)
_COLUMN_SWEEP: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("", 512, {}),
    ("tables4", 512, {"per_rank": 4}),
    ("pf32", 512, {"pooling_factor": 32.0}),
    ("batch2048", 2048, {}),
    ("batch128_pf8", 128, {"pooling_factor": 8.0}),
    ("dim512", 512, {"dim": 512}),
    ("rows1k", 512, {"rows": 1_000}),
    ("rows1m", 512, {"rows": 1_000_000}),
)
_DP_SWEEP: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("", 512, {"rows": 10_000}),
    ("rows1k", 512, {"rows": 1_000}),
    ("rows50k", 512, {"rows": 50_000}),
    ("dim16_rows50k", 512, {"dim": 16, "rows": 50_000}),
    ("dim256_rows20k", 512, {"dim": 256, "rows": 20_000}),
    ("pf32", 512, {"rows": 10_000, "pooling_factor": 32.0}),
    ("batch2048", 2048, {"rows": 10_000}),
    ("batch128_dim16", 128, {"rows": 10_000, "dim": 16}),
    ("tables8_rows1k", 512, {"per_rank": 8, "rows": 1_000}),
    ("pf32_batch2048", 2048, {"rows": 10_000, "pooling_factor": 32.0}),
)
QUICK = frozenset({"", "tables8", "tables48_rows20k_dim32_pf8_batch128", "dim8", "dim256", "pf48", "batch2048",
                   "rows1k", "rows4m", "rows1k_pf48_batch2048", "rows4m_pf32_batch1024", "pf32", "rows50k",
                   "dim16_rows50k", "dim256_rows20k"})


def _sweeps(st: ShardingType, quick: bool) -> Iterator[ProbeSpec]:
    """One sharding type's probes: a base, then one thing varied at a time, and a few together;
    beside ``COMPANION`` unless ``st`` is its type."""
    companion = () if st is COMPANION.sharding_type else (COMPANION,)
    if st is DP:
        sweep, defaults = _DP_SWEEP, {}
    elif st in (CW, TCW):
        sweep, defaults = _COLUMN_SWEEP, {"per_rank": 1, "dim": 256}  # a table: two 128-column shards
    else:
        sweep, defaults = _LOOKUP_SWEEP, {}
    for suffix, batch, fields in sweep:
        if quick and suffix not in QUICK:
            continue
        name = f"{st.value}_{suffix}" if suffix else st.value
        yield ProbeSpec(name, (*companion, Tables(st, **{**defaults, **fields})), batch)


def probe_specs(device: ComputeDevice, quick: bool = False, scaled: bool = True) -> tuple[ProbeSpec, ...]:
    """Every probe for ranks of ``device`` (``quick``: about half, for a rough profile fast)."""
    offered = sharder_options(device)
    types = [st for st in ShardingType if st in offered]
    out = [p for st in types for p in _sweeps(st, quick)]
    scale = BATCH_SCALE[device]
    for st in types:  # the device's other kernels
        for kernel in offered[st][1:]:
            group = Tables(st, kernel=kernel, dim=256 if st in (CW, TCW) else 64)
            out.append(ProbeSpec(f"{st.value}_{kernel.value}", (group,) if st is TW else (COMPANION, group)))
    mixes = [(TW, CW, DP), (TW, CW, TCW, DP)]
    for mix in mixes if not quick else mixes[:1]:
        if all(st in offered for st in mix):
            groups = tuple(Tables(st, per_rank=1, dim=256 if st in (CW, TCW) else 64,
                                  rows=10_000 if st is DP else Tables.rows) for st in mix)
            out.append(ProbeSpec("+".join(st.value for st in mix), groups))
    out += module_probes(types, quick)
    if device is ComputeDevice.CUDA:
        out += cache_probes(types, quick)
    if device is ComputeDevice.CUDA and not quick:
        out += [*gpu_probes(types), *mixed_probes()]
    return tuple(replace(p, batch_size=p.batch_size * _scale(p, scale)) if scaled else p for p in out)


# (seed, tables, batch, share allow-listed column-wise): random specs the search plans freely, beside
# the sweeps. What a GPU shows between the sweeps' one-thing-at-a-time points (many tables of mixed
# dims, pooling factors and sharding types in one plan) is then measured too. Seeds apart from the
# calibration bench's (1-12), whose specs the same generator makes.
MIXED = ((101, 10, 256, 0.0), (102, 24, 128, 0.2), (103, 40, 64, 0.0), (104, 80, 32, 0.1), (105, 6, 512, 0.0),
         (106, 16, 256, 0.25), (107, 60, 64, 0.0), (108, 120, 32, 0.0))
MIXED_MEMORY_BYTES = 8e9  # a mixed probe's tables together (one rank holds them all on one GPU)


MIXED_TABLE_WISE = (103, 107, 108)  # planned again with every table table_wise


def mixed_probes() -> list[ProbeSpec]:
    """The random specs planned freely, and some again all table_wise: planned under TorchRec's
    default profile, which on one GPU puts the big tables row_wise, only the second shows table_wise
    on big tables with many ids (what a calibrated profile then chooses for them)."""
    from rec.spec.synthetic import random_table_rows

    out = []
    for seed, tables, batch, share in MIXED:
        rows = tuple(random_table_rows(seed, tables, share, MIXED_MEMORY_BYTES))
        out.append(ProbeSpec(f"mixed_{seed}", (), batch, rows))
        if seed in MIXED_TABLE_WISE:
            only = tuple({**row, "sharding_types": [TW.value]} for row in rows)
            out.append(ProbeSpec(f"mixed_{seed}_table_wise", (), batch, only))
    return out


# What only a GPU shows between the sweeps' points. FBGEMM runs a rank's tables of one sharding type
# in one kernel at the width of the widest (rec.cost.widest): narrow tables with many ids beside a wide
# one. And a kernel's tables cost little each, whatever their number: many tables, few ids, at a batch
# the GPU's fixed costs dominate (not scaled up, unlike every other cuda probe).
GPU_PROBE_TYPES = (TW, RW, TWRW)
_GPU_GROUPS: tuple[tuple[str, tuple[dict[str, Any], ...], bool], ...] = (
    ("dims16+256", ({"dim": 16, "pooling_factor": 16.0}, {"dim": 256, "pooling_factor": 1.0, "per_rank": 1}), True),
    ("dims32+128", ({"dim": 32, "pooling_factor": 8.0, "per_rank": 4},
                    {"dim": 128, "pooling_factor": 1.0, "per_rank": 1}), True),
    ("tables128_unscaled", ({"per_rank": 128, "rows": 10_000, "dim": 32, "pooling_factor": 2.0},), False),
)


def gpu_probes(types: list[ShardingType]) -> list[ProbeSpec]:
    out = []
    for st in GPU_PROBE_TYPES:
        if st not in types:
            continue
        companion = () if st is COMPANION.sharding_type else (COMPANION,)
        for suffix, groups, scaled in _GPU_GROUPS:
            out.append(ProbeSpec(f"{st.value}_{suffix}", (*companion, *(Tables(st, **g) for g in groups)),
                                 scaled=scaled))
    return out


# fused_uvm_caching tables whose cache size the spec fixes (the planner grows no cache it fixes: the
# kernel's own probe above gets a cache of the whole table, which misses nothing): the size swept
# under the skew model of the synthetic ids, and at one size a skewed and a flat hit-rate curve
# (the measuring job draws each table's ids from its curve). The misses (miss rate x bytes looked
# up, over the host link) then vary apart from the bytes looked up, which the caching kernel's
# lookup coefficient prices whatever the cache. A million rows: a batch's ids (a few hundred
# thousand a table) mostly distinct rows, as in the large tables workloads cache.
SKEWED_CURVE = ((0.01, 0.5), (0.05, 0.8), (0.2, 0.95))
FLAT_CURVE = ((0.5, 0.5),)
CACHE_ROWS = 1_000_000
CACHE_PROBES: tuple[tuple[str, ShardingType, float, tuple[tuple[float, float], ...] | None], ...] = (
    ("cache5", TW, 0.05, None),
    ("cache20", TW, 0.2, None),
    ("cache60", TW, 0.6, None),
    ("cache20_skewed", TW, 0.2, SKEWED_CURVE),
    ("cache20_flat", TW, 0.2, FLAT_CURVE),
    ("cache20", RW, 0.2, None),
)
QUICK_CACHE = frozenset({"cache5", "cache60"})  # on table_wise: the term told apart, roughly


def cache_probes(types: list[ShardingType], quick: bool = False) -> list[ProbeSpec]:
    """The fused_uvm_caching probes of ``CACHE_PROBES`` whose sharding type the device offers."""
    out = []
    for suffix, st, load_factor, curve in CACHE_PROBES:
        if st not in types or (quick and (st is not TW or suffix not in QUICK_CACHE)):
            continue
        group = Tables(st, rows=CACHE_ROWS, kernel=ComputeKernel.FUSED_UVM_CACHING, cache_load_factor=load_factor,
                       hit_rate_curve=curve)
        companion = () if st is COMPANION.sharding_type else (COMPANION,)
        out.append(ProbeSpec(f"{st.value}_{ComputeKernel.FUSED_UVM_CACHING.value}_{suffix}", (*companion, group)))
    return out


# Each embedding module runs its own input and output distribution per sharding type: a type's tables
# split over two modules (beside the companion, in the default module) show what a further module of
# that type adds (``module_sharding_type_ms``). On 2 cpu ranks 4 table_wise tables took 4.6 ms in one
# module and 13-15 ms in four (bench/RESULTS.md §17).
MODULES = ("probe.first", "probe.second")


def module_probes(types: list[ShardingType], quick: bool = False) -> list[ProbeSpec]:
    """A probe per sharding type (``quick``: table_wise's alone) whose tables of that type sit in two modules."""
    out = []
    for st in types:
        if quick and st is not COMPANION.sharding_type:
            continue
        dim = 256 if st in (CW, TCW) else 64
        rows = 10_000 if st is DP else Tables.rows
        groups = tuple(Tables(st, per_rank=1, dim=dim, rows=rows, module=m) for m in MODULES)
        out.append(ProbeSpec(f"{st.value}_modules2", (COMPANION, *groups)))
    return out


def _scale(probe: ProbeSpec, scale: int) -> int:
    """The probe's batch multiple: ``scale``, less where lookups come over the host link
    (``UVM_BATCH_DIVISOR``), and halved until its ids per rank and batch are within ``MAX_PROBE_IDS``."""
    if not probe.scaled:
        return 1
    if scale > 1 and any(g.misses for g in probe.groups):
        scale = max(1, scale // UVM_BATCH_DIVISOR)
    ids_per_sample = (sum(g.per_rank * g.pooling_factor for g in probe.groups)
                      + sum(float(r.get("pooling_factor", 1.0)) for r in probe.rows))
    output_per_sample = (sum(g.per_rank * g.dim * 4 for g in probe.groups)
                         + sum(int(r["embedding_dim"]) * 4 for r in probe.rows))
    while scale > 1 and (probe.batch_size * scale * ids_per_sample > MAX_PROBE_IDS
                         or probe.batch_size * scale * output_per_sample > MAX_PROBE_OUTPUT_BYTES):
        scale //= 2
    return scale


def probe_rows(probe: ProbeSpec, device: ComputeDevice, world_size: int) -> list[dict[str, Any]]:
    """The probe's spec rows: every table with its sharding type and kernel allow-listed (a mixed
    probe: its own rows)."""
    if probe.rows:
        return [dict(row) for row in probe.rows]
    rows = []
    for g, group in enumerate(probe.groups):
        kernel = group.kernel or sharder_options(device)[group.sharding_type][0]
        shards = group.dim // 128 if group.sharding_type in (CW, TCW) else 1
        if group.sharding_type is DP:
            count = group.per_rank
        elif group.sharding_type in (RW, TWRW):
            count = group.per_rank  # every table has a shard on every rank (of the host)
        else:
            count = max(1, group.per_rank * world_size // shards)
        cache: dict[str, Any] = {}
        if group.cache_load_factor is not None:
            cache["cache_load_factor"] = group.cache_load_factor
        if group.hit_rate_curve is not None:
            cache["hit_rate_curve"] = [list(point) for point in group.hit_rate_curve]
        module = {"module": group.module} if group.module is not None else {}
        for i in range(count):
            rows.append({"name": f"g{g}_t{i}", "num_embeddings": group.rows, "embedding_dim": group.dim,
                         "pooling_factor": group.pooling_factor, "sharding_types": [group.sharding_type.value],
                         "compute_kernels": [kernel.value], **cache, **module})
    return rows


def probe_plans(topology: Topology, quick: bool = False, cost: CostConfig = CostConfig()) -> tuple[Probe, ...]:
    """The probes as plans for ``topology``'s ranks (each at its own batch size, halved while the
    ranks' memory cannot hold its plan, down to the probe's unscaled batch), planned under
    TorchRec's default profile: the fit re-rates them under each unit profile anyway."""
    from rec.planning import plan_spec
    from rec.spec import spec_from_rows
    from rec.topology import topology_from_dict, topology_to_dict

    cost = replace(cost, profile=DEFAULT_PROFILE)
    smallest = {p.name: p.batch_size for p in probe_specs(topology.compute_device, quick, scaled=False)}
    out = []
    for probe in probe_specs(topology.compute_device, quick):
        spec = spec_from_rows(probe_rows(probe, topology.compute_device, topology.world_size),
                              source=f"probe {probe.name}")
        batch = probe.batch_size
        while True:  # a rank's input and output buffers grow with the ranks: more ranks, a smaller batch
            ranks = topology_from_dict({**topology_to_dict(topology), "batch_size": batch}, source="probe")
            try:
                plan = plan_spec(spec, ranks, cost, PROBE_SEARCH)
                break
            except InputError:
                if batch // 2 < smallest[probe.name]:
                    raise
                batch //= 2
        out.append(Probe(probe.name, plan))
    return tuple(out)
