"""A hardware profile: the numbers TorchRec's perf estimator takes from the hardware, as one value.

Mirrors TorchRec 1.8's ``torchrec/distributed/planner/estimator/`` (``HardwarePerfConfig``,
``PerfCoefficientConfig``, ``EstimatorPerfCoefficients``, ``PerfCoefficient``) plus the bandwidths
TorchRec reads from its ``Topology``, and a few documented extensions (docs/profile.md) whose
defaults add nothing. ``Profile()`` is TorchRec's default configuration: with it the cost model gives
exactly the estimates it gives without a profile. Validated by ``rec.profile.profile_from_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rec.sharding import ComputeDevice, ComputeKernel, ShardingType

# TorchRec 1.8's empirical factors (torchrec/distributed/planner/constants.py), the defaults here.
BWD_COMPUTE_MULTIPLIER = 2.0
WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER = 1.0
WEIGHTED_KERNEL_MULTIPLIER = 1.1
BATCHED_COPY_PERF_FACTOR = 2.455
DP_ELEMENTWISE_KERNELS_PERF_FACTOR = 9.22


@dataclass(frozen=True)
class PerfCoefficient:
    """TorchRec's ``PerfCoefficient``: multipliers of the byte counts a lookup moves, plus ``fixed_ms``.

    time = (input_read_size_multiplier x input bytes + lookup_size_multiplier x looked-up bytes
            + embedding_output_multiplier x output bytes + hash_size_multiplier x shard rows)
           [x block-usage penalty, forward table_wise only] / kernel bandwidth + fixed_ms
           + (unique_read_size_multiplier x distinct rows x 8
              + unique_lookup_size_multiplier x distinct rows' bytes) / kernel bandwidth
    """

    input_read_size_multiplier: float = 1.0
    lookup_size_multiplier: float = 1.0
    embedding_output_multiplier: float = 1.0
    hash_size_multiplier: float = 0.0
    fixed_ms: float = 0.0  # extension: ms per shard and pass, whatever its size (kernel launch, bookkeeping)
    # Extensions: the distinct rows the pass touches (rec.cost.unique: expected under the measuring
    # job's ids), each once however many ids hit it (a cache miss forward, an optimizer update
    # backward): their index bytes (8 per row, the cost of reaching a row) and their embedding bytes.
    unique_read_size_multiplier: float = 0.0
    unique_lookup_size_multiplier: float = 0.0


@dataclass(frozen=True)
class ShardingCoefficients:
    """TorchRec's ``EstimatorPerfCoefficients``: forward and backward compute of one sharding type."""

    fwd: PerfCoefficient = field(default_factory=PerfCoefficient)
    bwd: PerfCoefficient | None = None  # None: backward = forward x bwd_compute_multiplier


@dataclass(frozen=True)
class KernelCoefficients:
    """A ``PerfCoefficientConfig.by_kernel`` entry: coefficients of one (sharding type, kernel)."""

    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    coefficients: ShardingCoefficients


@dataclass(frozen=True)
class Coefficients:
    """TorchRec's ``PerfCoefficientConfig`` (its prefetch regression coefficients never apply to what
    shardflow plans), with the weighted-feature multipliers: a weighted table's backward is
    ``weighted_feature_bwd_compute_multiplier`` x its unweighted backward, plus
    ``weighted_kernel_multiplier`` x its forward for the weights' gradient kernel.

    Lookup order, as TorchRec's ``get_coefficients``: ``by_kernel`` (exact sharding type and
    kernel), then the sharding type's field (``column_wise`` also serves table_column_wise)."""

    table_wise: ShardingCoefficients = field(default_factory=ShardingCoefficients)
    column_wise: ShardingCoefficients = field(default_factory=ShardingCoefficients)
    row_wise: ShardingCoefficients = field(default_factory=ShardingCoefficients)
    table_row_wise: ShardingCoefficients = field(default_factory=ShardingCoefficients)
    data_parallel: ShardingCoefficients = field(default_factory=ShardingCoefficients)
    by_kernel: tuple[KernelCoefficients, ...] = ()  # sorted by (sharding type, kernel), one each
    bwd_compute_multiplier: float = BWD_COMPUTE_MULTIPLIER
    weighted_feature_bwd_compute_multiplier: float = WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER
    weighted_kernel_multiplier: float = WEIGHTED_KERNEL_MULTIPLIER

    def of(self, sharding_type: ShardingType, kernel: ComputeKernel) -> ShardingCoefficients:
        """The coefficients TorchRec's estimator uses for ``sharding_type`` on ``kernel``."""
        for entry in self.by_kernel:
            if entry.sharding_type == sharding_type and entry.compute_kernel == kernel:
                return entry.coefficients
        attribute = SHARDING_COEFFICIENTS.get(sharding_type)
        if attribute is None:
            raise ValueError(f"no coefficients for sharding type {sharding_type.value}")
        coefficients: ShardingCoefficients = getattr(self, attribute)
        return coefficients


# Which Coefficients field serves a sharding type (TorchRec's PerfCoefficientConfig.get_coefficients).
SHARDING_COEFFICIENTS: dict[ShardingType, str] = {
    ShardingType.TABLE_WISE: "table_wise",
    ShardingType.COLUMN_WISE: "column_wise",
    ShardingType.TABLE_COLUMN_WISE: "column_wise",
    ShardingType.ROW_WISE: "row_wise",
    ShardingType.TABLE_ROW_WISE: "table_row_wise",
    ShardingType.DATA_PARALLEL: "data_parallel",
}


@dataclass(frozen=True)
class Bandwidths:
    """Bytes/s, as written (the cost model divides by 1,000 for TorchRec's bytes/ms, as a topology
    does). None: the topology's value, or TorchRec's default where no topology key exists."""

    hbm_mem_bw: float | None = None
    ddr_mem_bw: float | None = None
    hbm_to_ddr_mem_bw: float | None = None  # the UVM link; no topology key, TorchRec: 32 GiB/s
    intra_host_bw: float | None = None
    inter_host_bw: float | None = None


@dataclass(frozen=True)
class KernelBandwidths:
    """TorchRec's ``HardwarePerfConfig.kernel_device_bandwidths`` on the topology's device (bytes/s):
    a kernel's effective bandwidth, replacing the one derived from HBM/DDR bandwidths. None: derived."""

    dense: float | None = None
    fused: float | None = None
    fused_uvm: float | None = None
    fused_uvm_caching: float | None = None

    def of(self, kernel: ComputeKernel) -> float | None:
        value: float | None = getattr(self, kernel.value, None)
        return value


@dataclass(frozen=True)
class Extensions:
    """Terms TorchRec's formulas lack or hard-code, for fitting measurements; the defaults add nothing."""

    # ms per collective a shard takes part in, over the link whose bandwidth the collective uses
    # (the alpha of an alpha-beta model whose beta is 1 / bandwidth).
    intra_host_latency_ms: float = 0.0
    inter_host_latency_ms: float = 0.0
    batched_copy_factor: float = BATCHED_COPY_PERF_FACTOR  # row_wise/table_row_wise backward copy
    dp_optimizer_factor: float = DP_ELEMENTWISE_KERNELS_PERF_FACTOR  # data_parallel optimizer kernels
    # Per kernel group on a rank (rec.cost.widest): a shard's ids priced at the group's widest row
    # instead of its own, as FBGEMM runs them; this multiplies the difference's bytes.
    widest_dim_multiplier: float = 0.0
    # Plan-level terms, the same on every rank: not per shard, so TorchRec's per-shard Perf (and the
    # search, which sums it per rank) leaves them out; a plan's predicted time adds them
    # (rec.analysis.rank_times). ms per iteration whatever the plan (the framework's own work), and ms
    # per iteration for each sharding type the plan uses (TorchRec runs one input and one output
    # distribution per sharding type, however many tables it holds: their collectives' latency).
    iteration_ms: float = 0.0
    # fused_uvm_caching shards priced by their cache's miss rate (rec.cost.bandwidth.kernel_bw): the
    # weight of a missed lookup's bytes at fused_uvm's bandwidth. 0: TorchRec's rule, linear in the
    # cache's size whatever the ids.
    cache_miss_multiplier: float = 0.0
    # A pooled table's outputs for the samples whose bag is empty (pooling factor below 1): TorchRec
    # 1.8 counts min(1, pooling factor) outputs per sample and feature (0, its rule, which suits
    # variable-batch features); without variable batches every sample gets a pooled vector, which the
    # kernel writes and the output all-to-all moves (1: one per sample, as TorchRec 1.6 counts them).
    empty_bag_output_multiplier: float = 0.0
    sharding_type_ms: tuple[tuple[ShardingType, float], ...] = ()  # in ShardingType order, one each
    # Per sharding type, what each further embedding module using it adds per iteration: each module
    # runs its own input and output distribution per sharding type, so a second module of a type
    # repeats them (rec.analysis.rank_times; bench/RESULTS.md §17). In ShardingType order, one each.
    module_sharding_type_ms: tuple[tuple[ShardingType, float], ...] = ()

    def sharding_type_cost(self, sharding_type: ShardingType) -> float:
        """``sharding_type_ms`` of ``sharding_type`` (0 where it names none)."""
        return next((ms for st, ms in self.sharding_type_ms if st == sharding_type), 0.0)

    @property
    def prices_types(self) -> bool:
        """Whether some sharding type costs time per iteration (``sharding_type_ms`` or
        ``module_sharding_type_ms``)."""
        return bool(self.sharding_type_ms or self.module_sharding_type_ms)

    def module_sharding_type_cost(self, sharding_type: ShardingType) -> float:
        """``module_sharding_type_ms`` of ``sharding_type`` (0 where it names none)."""
        return next((ms for st, ms in self.module_sharding_type_ms if st == sharding_type), 0.0)

    def type_costs(self, modules_using: dict[ShardingType, int]) -> float:
        """The per-type plan-level terms of a plan whose sharding types each serve this many modules."""
        return sum(self.sharding_type_cost(st) + (n - 1) * self.module_sharding_type_cost(st)
                   for st, n in sorted(modules_using.items()) if n > 0)


@dataclass(frozen=True)
class Machine:
    """Where a profile was measured (written by calibration; all but ``device`` optional)."""

    device: ComputeDevice
    device_name: str | None = None  # e.g. "NVIDIA H100 80GB HBM3", or the CPU model
    torch_version: str | None = None
    fbgemm_version: str | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    measured_at: str | None = None  # ISO 8601


@dataclass(frozen=True)
class Profile:
    """Bandwidths, coefficients and extensions of the cost model; ``Profile()`` is TorchRec's default."""

    name: str | None = None
    bandwidths: Bandwidths = field(default_factory=Bandwidths)
    kernel_bandwidths: KernelBandwidths = field(default_factory=KernelBandwidths)
    coefficients: Coefficients = field(default_factory=Coefficients)
    extensions: Extensions = field(default_factory=Extensions)
    machine: Machine | None = None

    @property
    def is_default(self) -> bool:
        """True when this is TorchRec's default configuration (and names no machine)."""
        return self == DEFAULT_PROFILE

    def without_network(self) -> Profile:
        """The same profile leaving the links between ranks to the topology: no intra- or inter-host
        bandwidth, no collective latency (how the plan breakdown separates compute from comms)."""
        return replace(self, bandwidths=replace(self.bandwidths, intra_host_bw=None, inter_host_bw=None),
                       extensions=replace(self.extensions, intra_host_latency_ms=0.0, inter_host_latency_ms=0.0))


DEFAULT_PROFILE = Profile()
