"""Fit a profile to measured plans: non-negative least squares on the cost model's own formulas.

Every number a fit estimates enters a plan's predicted time (``rec.analysis.rank_times``) linearly:
a compute coefficient or ``fixed_ms`` with the kernel bandwidth held fixed, a link's inverse
bandwidth (ms per byte), a plan-level term. So a plan's predicted time is ``A @ theta``, where
column k of ``A`` is the prediction under the *unit profile* of parameter k: that number at 1
(an inverse bandwidth at 1 ms per byte), every other fitted number at 0, and no term the fit leaves
out (``base_profile``). ``A`` comes from evaluating the cost model, not from a copy of its formulas.

Which numbers are fitted, and why not the others (all else keeps TorchRec's default):

* Per sharding type measured, the forward coefficients ``input_read_size_multiplier`` (ids),
  ``lookup_size_multiplier`` (bytes looked up), ``hash_size_multiplier`` (rows), ``fixed_ms`` (per
  shard) and the distinct-row extensions ``unique_read_size_multiplier`` and
  ``unique_lookup_size_multiplier`` (not for data_parallel, whose dense backward updates the whole
  table); table_wise and column_wise (which also serves table_column_wise) share one value each:
  the same kernel does the lookups.
  ``embedding_output_multiplier`` only for data_parallel: for the others it is proportional to the
  bytes every collective moves, like the link's inverse bandwidth, so the two cannot be told apart
  (it is set to 0 and the link carries the output).
  Backward is TorchRec's default, forward x ``bwd_compute_multiplier``: the measured iteration is
  forward plus backward, so only their sum is identifiable.
* Per uvm kernel measured (fused_uvm, fused_uvm_caching), its own ``lookup_size_multiplier`` for every
  sharded type (``coefficients.by_kernel``), whose ``fixed_ms`` is the type's and other byte terms 0.
* ``widest_dim_multiplier``, where some plan runs tables of different widths in one kernel group
  (``rec.cost.widest``; the cuda probes do).
* ``cache_miss_multiplier``, where some plan on cuda has a fused_uvm_caching table (``misses_fitted``):
  the bytes of a cache's missed lookups over fused_uvm's bandwidth, added to the shard's time (its
  column is that term at multiplier 1; the cuda probes vary the cache's size and the ids' skew, so
  it is told apart from the caching kernel's ``lookup_size_multiplier``). A multiplier above 0
  also switches the caching kernel's bandwidth to the fused kernel's (every id is looked up in the
  HBM cache); so that the switch moves no other column, such a fit pins fused_uvm_caching's kernel
  bandwidth to fused's in every unit profile (and in the profile it writes, where a multiplier of 0
  then means the same as one above 0 with free misses): ``A @ theta`` stays the prediction.
* The kernel bandwidths are pinned to the topology's (coefficients and bandwidth only appear as
  their ratio).
* ``intra_host_bw`` and ``inter_host_bw`` through their inverse; the per-collective latency
  extensions are 0 (per shard, like ``fixed_ms``); data_parallel's ``dp_optimizer_factor`` is 0 and
  its all-reduce bandwidth carries the optimizer too (both scale with the table's bytes), the
  row-wise ``batched_copy_factor`` likewise; ``empty_bag_output_multiplier`` is 1 (the measuring job
  gives every sample a pooled vector per feature, however many of its bags are empty).
* The plan-level ``iteration_ms`` and ``sharding_type_ms`` of each sharding type measured, but
  for one that every plan uses (the probes' table_wise companion): ``iteration_ms`` carries it; and
  ``module_sharding_type_ms`` of each type some plan uses in several embedding modules (the probes
  that split a type's tables over two modules).

Rows are weighted by 1 / measured time (relative errors, as the targets are stated) and, robustly,
by Huber's weights (a probe a burst of load slowed counts less), columns scaled to unit norm; a
column that is all zero (nothing measured moves it) is left out and its number keeps the default.
The result is validated like any profile file.

Each fitted number's confidence is its relative standard error (standard error / value; of an inverse
bandwidth, to first order that of the bandwidth), the linearised estimate of the last weighted fit:
``s**2 (X^T W X)^-1`` over the numbers not at 0, with ``X`` the relative rows, ``W`` the Huber
weights and ``s**2 = sum(w r**2) / (plans - numbers not at 0)`` from the relative residuals ``r``
(the active set and the weights taken as given). A number at 0 (the bound) has none; one the
measurements cannot tell apart from others (or with no residual degree of freedom left) has an
infinite one. Above ``POOR_RELATIVE_ERROR`` a number is reported as poorly determined.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np

from rec.analysis.rank_times import mixes_widths, predicted_ms
from rec.cost.bandwidth import kernel_bw, links
from rec.errors import InputError, Problem
from rec.plan.types import Plan
from rec.profile.types import (
    DEFAULT_PROFILE,
    SHARDING_COEFFICIENTS,
    KernelBandwidths,
    KernelCoefficients,
    Machine,
    PerfCoefficient,
    Profile,
    ShardingCoefficients,
)
from rec.profile.validate import profile_from_dict, profile_to_dict
from rec.sharding import (
    COMPUTE_KERNELS,
    SHARDING_TYPES,
    ComputeDevice,
    ComputeKernel,
    ShardingType,
    modules_using,
)
from rec.topology.types import MAX_BANDWIDTH, Topology
from rec.topology.validate import MS_PER_S

SIGNIFICANT_DIGITS = 6  # of each fitted number as written
BALANCE_ROUNDS = 3  # refits choosing each plan's busiest rank under the last fit
ROBUST_ROUNDS = 10  # reweightings of the robust fit
HUBER_K = 1.5  # residuals beyond this many robust standard deviations get less weight
MAD_TO_SD = 1.4826  # median absolute deviation -> standard deviation, for normal noise
MIN_HUBER_CUT = 0.02  # relative: residuals below 2% always count fully
ROW_WISE_TYPES = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)
SHARED_BLOCKS = ("table_wise", "column_wise")  # one lookup kernel: one value for both
POOR_RELATIVE_ERROR = 0.5  # a number whose standard error exceeds half of it is named poorly determined
MISSES = "cache_miss_multiplier"  # the parameter's name
UNDETERMINED = 1e-6  # a column with this much weight in a direction the rows leave free has no standard error
# The dense kernel's backward is a dense gradient of the whole table, not per row touched.
DENSE_UNFITTED = ("unique_read_size_multiplier", "unique_lookup_size_multiplier")
# Read over the host link, not from HBM: with the kernel bandwidths pinned, one lookup coefficient for
# HBM and uvm rows would be fitted to neither (on an H200 it went to 0.002 and the HBM plans came out
# 40% too fast), so each uvm kernel has its own (``coefficients.by_kernel``) and its other byte terms
# are 0 (divided by the host link's bandwidth, HBM's per-id terms would be hundreds of times too
# dear); ``fixed_ms`` is the sharding type's.
UVM_KERNELS = (ComputeKernel.FUSED_UVM, ComputeKernel.FUSED_UVM_CACHING)


class Kind(StrEnum):
    FACTOR = "factor"  # a coefficient
    MS = "ms"  # a time
    INVERSE_BANDWIDTH = "ms_per_byte"  # written as a bandwidth, bytes/s = 1000 / value


@dataclass(frozen=True)
class Parameter:
    """One fitted number, written at every profile key in ``paths`` (docs/profile.md's names)."""

    name: str
    paths: tuple[str, ...]
    kind: Kind


@dataclass(frozen=True)
class Measured:
    """A plan and its measured iteration time (the critical path: the slowest rank's median)."""

    name: str
    plan: Plan
    measured_ms: float


@dataclass(frozen=True)
class ProbeFit:
    name: str
    measured_ms: float
    predicted_ms: float  # under the fitted profile

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_ms / self.measured_ms - 1


@dataclass(frozen=True)
class Fit:
    profile: Profile
    values: dict[str, float]  # parameter name -> fitted value (inverse bandwidths as bytes/s)
    probes: tuple[ProbeFit, ...]
    left_out: tuple[str, ...]  # parameters nothing measured moves: their defaults stay
    # parameter name -> relative standard error (module docstring); None at 0, inf where undetermined
    relative_errors: dict[str, float | None] = dataclasses.field(default_factory=dict)

    @property
    def poorly_determined(self) -> tuple[str, ...]:
        """The fitted numbers whose relative standard error exceeds ``POOR_RELATIVE_ERROR``, worst first."""
        poor = {name: e for name, e in self.relative_errors.items() if e is not None and e > POOR_RELATIVE_ERROR}
        return tuple(sorted(poor, key=lambda name: -poor[name]))

    @property
    def median_abs_error(self) -> float:
        return float(np.median([abs(p.error) for p in self.probes]))

    @property
    def max_abs_error(self) -> float:
        return float(max(abs(p.error) for p in self.probes))


def measured_types(plans: Sequence[Plan]) -> tuple[tuple[ShardingType, ...], tuple[ComputeKernel, ...]]:
    """The sharding types and kernels the plans use, in enum order."""
    st = {SHARDING_TYPES[int(c)] for p in plans for c in np.unique(p.columns.sharding_type)}
    ck = {COMPUTE_KERNELS[int(c)] for p in plans for c in np.unique(p.columns.compute_kernel)}
    return tuple(s for s in ShardingType if s in st), tuple(k for k in ComputeKernel if k in ck)


def types_everywhere(plans: Sequence[Plan]) -> tuple[ShardingType, ...]:
    """The sharding types every plan uses."""
    common = set(ShardingType)
    for p in plans:
        common &= {SHARDING_TYPES[int(c)] for c in np.unique(p.columns.sharding_type)}
    return tuple(s for s in ShardingType if s in common)


def misses_fitted(topology: Topology, kernels: Sequence[ComputeKernel]) -> bool:
    """Whether a fit on ``kernels`` estimates ``cache_miss_multiplier``: a cache on cuda (none on cpu)."""
    return topology.compute_device is ComputeDevice.CUDA and ComputeKernel.FUSED_UVM_CACHING in kernels


def parameters(types: Sequence[ShardingType], everywhere: Sequence[ShardingType] = (),
               kernels: Sequence[ComputeKernel] = (), widths: bool = False,
               misses: bool = False, modules: Sequence[ShardingType] = ()) -> tuple[Parameter, ...]:
    """The numbers a fit on plans using ``types`` on ``kernels`` estimates (see the module
    docstring); the ``sharding_type_ms`` of a type in ``everywhere`` (every plan uses it) cannot be
    told apart from ``iteration_ms``, which then carries it; ``widths``: some plan runs tables of
    different widths in one kernel group (``widest_dim_multiplier``); ``misses``: the caches' misses
    (``cache_miss_multiplier``, ``misses_fitted``); ``modules``: the types some plan uses in several
    embedding modules (their ``module_sharding_type_ms``)."""
    blocks = _blocks(types)
    uvm = [ck for ck in UVM_KERNELS if ck in kernels]
    out: list[Parameter] = []
    for field in ("input_read_size_multiplier", "lookup_size_multiplier", "hash_size_multiplier", "fixed_ms",
                  "unique_read_size_multiplier", "unique_lookup_size_multiplier"):
        kind = Kind.MS if field == "fixed_ms" else Kind.FACTOR
        own = uvm if field == "fixed_ms" else []  # the uvm kernels' byte terms: their lookups alone, below
        shared = [b for b in blocks if b in SHARED_BLOCKS]
        if shared:
            out.append(Parameter(f"{'+'.join(shared)}.fwd.{field}",
                                 tuple(f"coefficients.{b}.fwd.{field}" for b in shared)
                                 + _by_kernel_paths(shared, own, field), kind))
        out += [Parameter(f"{b}.fwd.{field}", (f"coefficients.{b}.fwd.{field}", *_by_kernel_paths([b], own, field)),
                          kind)
                for b in blocks if b not in SHARED_BLOCKS and not (b == "data_parallel" and field in DENSE_UNFITTED)]
    out += [Parameter(f"{ck.value}.fwd.lookup_size_multiplier",
                      _by_kernel_paths(blocks, [ck], "lookup_size_multiplier"), Kind.FACTOR) for ck in uvm]
    if widths:
        out.append(Parameter("widest_dim_multiplier", ("extensions.widest_dim_multiplier",), Kind.FACTOR))
    if misses:
        out.append(Parameter(MISSES, (f"extensions.{MISSES}",), Kind.FACTOR))
    if "data_parallel" in blocks:
        path = "coefficients.data_parallel.fwd.embedding_output_multiplier"
        out.append(Parameter(path.removeprefix("coefficients."), (path,), Kind.FACTOR))
    for link in ("intra_host_bw", "inter_host_bw"):
        out.append(Parameter(link, (f"bandwidths.{link}",), Kind.INVERSE_BANDWIDTH))
    out.append(Parameter("iteration_ms", ("extensions.iteration_ms",), Kind.MS))
    out += [Parameter(f"sharding_type_ms.{st.value}", (f"extensions.sharding_type_ms.{st.value}",), Kind.MS)
            for st in types if st not in everywhere]
    out += [Parameter(f"module_sharding_type_ms.{st.value}", (f"extensions.module_sharding_type_ms.{st.value}",),
                      Kind.MS) for st in types if st in modules]
    return tuple(out)


def types_in_several_modules(plans: Sequence[Plan]) -> tuple[ShardingType, ...]:
    """The sharding types some plan uses in more than one embedding module."""
    several = {st for p in plans for st, n in modules_using(p.columns.sharding_type, p.columns.modules).items()
               if n > 1}
    return tuple(st for st in ShardingType if st in several)


def _blocks(types: Sequence[ShardingType]) -> list[str]:
    """The ``Coefficients`` fields that serve ``types``, in their order, each once."""
    return list(dict.fromkeys(SHARDING_COEFFICIENTS[st] for st in types))


def _by_kernel_paths(blocks: Sequence[str], kernels: Sequence[ComputeKernel], field: str) -> tuple[str, ...]:
    """``coefficients.by_kernel`` keys of ``field`` for every sharded type of ``blocks`` on ``kernels``."""
    return tuple(f"coefficients.by_kernel.{st.value}.{ck.value}.fwd.{field}" for st in _types_of(blocks)
                 for ck in kernels)


def _types_of(blocks: Sequence[str]) -> tuple[ShardingType, ...]:
    """The sharding types (but data_parallel, whose kernel is dense) that ``blocks``' coefficients serve."""
    return tuple(st for st in ShardingType
                 if SHARDING_COEFFICIENTS.get(st) in blocks and st is not ShardingType.DATA_PARALLEL)


def base_profile(topology: Topology, types: Sequence[ShardingType], kernels: Sequence[ComputeKernel],
                 caching_ratio: float, misses: bool = False) -> Profile:
    """Every fitted number at 0 (links infinitely fast) and the terms the fit leaves out at 0;
    the kernels' bandwidths pinned to the topology's (``misses``: fused_uvm_caching's to fused's,
    whatever ``cache_miss_multiplier``, and the bandwidths its misses and lookups take pinned too).
    Not a valid profile file (infinite bandwidths): only for computing the design matrix."""
    coefficients = DEFAULT_PROFILE.coefficients
    zero = ShardingCoefficients(PerfCoefficient(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), None)
    blocks = _blocks(types)
    for block in blocks:
        coefficients = replace(coefficients, **{block: zero})  # type: ignore[arg-type]
    hw = links(topology, DEFAULT_PROFILE)
    pinned = {ck.value: kernel_bw(hw, DEFAULT_PROFILE, ck, caching_ratio) * MS_PER_S for ck in kernels}
    if misses:
        for ck in (ComputeKernel.FUSED, ComputeKernel.FUSED_UVM):
            pinned[ck.value] = kernel_bw(hw, DEFAULT_PROFILE, ck, None) * MS_PER_S
        pinned[ComputeKernel.FUSED_UVM_CACHING.value] = pinned[ComputeKernel.FUSED.value]
    coefficients = replace(coefficients, by_kernel=tuple(
        KernelCoefficients(st, ck, zero) for st in _types_of(blocks) for ck in UVM_KERNELS if ck in kernels))
    # Every measured sample gets a pooled vector per feature (no variable batches): empty bags too.
    extensions = replace(DEFAULT_PROFILE.extensions, intra_host_latency_ms=0.0, inter_host_latency_ms=0.0,
                         empty_bag_output_multiplier=1.0)
    if ShardingType.DATA_PARALLEL in types:
        extensions = replace(extensions, dp_optimizer_factor=0.0)
    if any(st in ROW_WISE_TYPES for st in types):
        extensions = replace(extensions, batched_copy_factor=0.0)
    return replace(DEFAULT_PROFILE, coefficients=coefficients, kernel_bandwidths=KernelBandwidths(**pinned),
                   bandwidths=replace(DEFAULT_PROFILE.bandwidths, intra_host_bw=math.inf, inter_host_bw=math.inf),
                   extensions=extensions)


def with_value(profile: Profile, parameter: Parameter, value: float) -> Profile:
    """``profile`` with ``parameter`` at ``value`` (an inverse bandwidth: ms per byte)."""
    for path in parameter.paths:
        number = value
        if parameter.kind is Kind.INVERSE_BANDWIDTH:
            number = MS_PER_S / value if value > 0 else math.inf
        profile = _set(profile, path.split("."), number)
    return profile


def _set(profile: Profile, path: list[str], value: float) -> Profile:
    section, *rest = path
    if section == "coefficients" and rest[0] == "by_kernel":
        st, ck, phase, field = ShardingType(rest[1]), ComputeKernel(rest[2]), rest[3], rest[4]
        entries = []
        for entry in profile.coefficients.by_kernel:
            if (entry.sharding_type, entry.compute_kernel) == (st, ck):
                current = getattr(entry.coefficients, phase) or PerfCoefficient()
                entry = replace(entry, coefficients=replace(entry.coefficients,
                                                            **{phase: replace(current, **{field: value})}))
            entries.append(entry)
        return replace(profile, coefficients=replace(profile.coefficients, by_kernel=tuple(entries)))
    if section == "coefficients":
        block, phase, field = rest
        coefficients: ShardingCoefficients = getattr(profile.coefficients, block)
        current = getattr(coefficients, phase) or PerfCoefficient()
        coefficients = replace(coefficients, **{phase: replace(current, **{field: value})})
        return replace(profile, coefficients=replace(profile.coefficients, **{block: coefficients}))  # type: ignore[arg-type]
    if section == "extensions" and rest[0] in ("sharding_type_ms", "module_sharding_type_ms"):
        st = ShardingType(rest[1])
        pairs = {**dict(getattr(profile.extensions, rest[0])), st: value}
        ordered = tuple((s, pairs[s]) for s in ShardingType if s in pairs)
        return replace(profile, extensions=replace(profile.extensions, **{rest[0]: ordered}))  # type: ignore[arg-type]
    return replace(profile, **{section: replace(getattr(profile, section), **{rest[0]: value})})


def design(plans: Sequence[Plan], base: Profile, params: Sequence[Parameter]) -> np.ndarray:
    """(plans, ranks, parameters): each rank's predicted time under each parameter's unit profile."""
    world = max(p.world_size for p in plans)
    out = np.zeros((len(plans), world, len(params)))
    for k, parameter in enumerate(params):
        unit = with_value(base, parameter, 1.0)
        for i, plan in enumerate(plans):
            out[i, :plan.world_size, k] = predicted_ms(plan, unit)
    return out


def fit_profile(measured: Sequence[Measured], topology: Topology, caching_ratio: float,
                name: str | None = None, machine: Machine | None = None) -> Fit:
    """The profile whose predictions best match ``measured`` (relative least squares, every
    number non-negative); InputError when the measurements cannot determine it."""
    from scipy.optimize import nnls

    title = "Cannot fit a profile to these measurements:"
    usable = [m for m in measured if math.isfinite(m.measured_ms) and m.measured_ms > 0]
    if not usable:
        raise InputError(title, [Problem("measurements", "no plan was measured (all failed or timed out)")])
    plans = [m.plan for m in usable]
    types, kernels = measured_types(plans)
    misses = misses_fitted(topology, kernels)
    params = parameters(types, types_everywhere(plans), kernels, any(map(mixes_widths, plans)), misses,
                        types_in_several_modules(plans))
    base = base_profile(topology, types, kernels, caching_ratio, misses)
    per_rank = design(plans, base, params)
    kept = np.flatnonzero(np.abs(per_rank).max(axis=(0, 1)) > 0)
    if len(usable) < len(kept):
        raise InputError(title, [Problem("measurements", (
            f"{len(usable)} plans measured ({len(measured) - len(usable)} failed or timed out), fewer than the "
            f"{len(kept)} numbers to fit; measure more (without --quick, or with a longer --time-limit)"))])
    target = np.array([m.measured_ms for m in usable])
    busiest = np.zeros(len(usable), dtype=np.int64)
    theta = np.zeros(len(params))
    for _ in range(BALANCE_ROUNDS):
        rows = per_rank[np.arange(len(usable)), busiest][:, kept] / target[:, None]
        theta[kept], weight = _robust_nnls(rows, nnls)
        now = (per_rank @ theta).argmax(axis=1)
        if np.array_equal(now, busiest):
            break
        busiest = now
    profile, values = _profile(base, params, kept, theta, name, machine)
    probes = tuple(ProbeFit(m.name, m.measured_ms, float(predicted_ms(m.plan, profile).max())) for m in usable)
    left_out = tuple(params[k].name for k in range(len(params)) if k not in set(kept.tolist()))
    errors = relative_errors(rows, theta[kept], weight)
    confidence = {params[k].name: None if math.isnan(e) else float(e)
                  for k, e in zip(kept.tolist(), errors.tolist(), strict=True)}
    return Fit(profile, values, probes, left_out, confidence)


def _robust_nnls(rows: np.ndarray, nnls: Any) -> tuple[np.ndarray, np.ndarray]:
    """``x >= 0`` with ``rows @ x`` closest to 1, relatively, by iteratively reweighted least squares
    with Huber's weights: a probe that a burst of load slowed (far off the rest) pulls no harder than
    one at ``HUBER_K`` robust standard deviations. Exact measurements keep every weight at 1. Returns
    ``x`` and the weights of its last round."""
    scale = np.linalg.norm(rows, axis=0)
    scaled = rows / scale
    weight = np.ones(len(rows))
    for _ in range(ROBUST_ROUNDS):
        root = np.sqrt(weight)
        solution, _ = nnls(scaled * root[:, None], root, maxiter=50 * rows.shape[1])
        residual = np.abs(scaled @ solution - 1)
        cut = max(HUBER_K * MAD_TO_SD * float(np.median(residual)), MIN_HUBER_CUT)
        new = np.minimum(1.0, cut / np.maximum(residual, 1e-300))
        if np.allclose(new, weight):
            break
        weight = new
    out: np.ndarray = solution / scale
    return out, weight


def relative_errors(rows: np.ndarray, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per column of ``rows``: the standard error of ``x`` over ``x`` in the weighted least squares
    ``rows @ x ~ 1`` (module docstring); NaN where ``x`` is 0, inf where undetermined."""
    out = np.full(len(x), np.nan)
    active = np.flatnonzero(x > 0)
    dof = len(rows) - len(active)
    if not len(active) or dof <= 0:
        out[active] = math.inf
        return out
    root = np.sqrt(weight)
    a = rows[:, active] * root[:, None]
    norm = np.linalg.norm(a, axis=0)
    residual = (rows @ x - 1) * root
    variance = float(residual @ residual) / dof
    _, s, vt = np.linalg.svd(a / norm, full_matrices=False)
    determined = s > s[0] * max(a.shape) * np.finfo(np.float64).eps
    # The diagonal of (A^T A)^-1 = V S^-2 V^T over the directions the rows determine.
    spread = ((vt[determined] / s[determined, None]) ** 2).sum(axis=0)
    error = np.sqrt(variance * spread) / norm / x[active]
    if not determined.all():
        error[np.abs(vt[~determined]).max(axis=0) > UNDETERMINED] = math.inf
    out[active] = error
    return out


def _profile(base: Profile, params: Sequence[Parameter], kept: np.ndarray, theta: np.ndarray,
             name: str | None, machine: Machine | None) -> tuple[Profile, dict[str, float]]:
    """The fitted numbers as a validated profile (rounded as written); InputError if out of range."""
    profile = replace(base, name=name, machine=machine)
    values = {}
    for k in kept.tolist():
        parameter, value = params[k], float(theta[k])
        if parameter.kind is Kind.INVERSE_BANDWIDTH:
            value = min(MS_PER_S / value, MAX_BANDWIDTH) if value > 0 else MAX_BANDWIDTH
        values[parameter.name] = _rounded(value)
        for path in parameter.paths:
            profile = _set(profile, path.split("."), values[parameter.name])
    # Links nothing measured keep the topology's bandwidth.
    bandwidths = {f.name: getattr(profile.bandwidths, f.name) for f in dataclasses.fields(profile.bandwidths)}
    bandwidths = {k: (None if v is not None and math.isinf(v) else v) for k, v in bandwidths.items()}
    profile = replace(profile, bandwidths=replace(profile.bandwidths, **bandwidths))
    try:
        return profile_from_dict(profile_to_dict(profile), source="fitted"), values
    except InputError as e:
        raise InputError("Cannot fit a profile to these measurements: fitted numbers out of range (implausible "
                         "times?):", e.problems) from None


def _rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
