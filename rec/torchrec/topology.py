"""shardflow's ``Topology`` and TorchRec's, both ways.

``torchrec_topology``: TorchRec's ``Topology`` for shardflow's, the one under which TorchRec's
enumerator and estimators rate every option as ``rec.cost`` does, to the last bit (tests/rec/test_cost.py).

``shardflow_topology``: TorchRec's ``Topology``, batch size and storage reservation as shardflow's.
What shardflow's topology has no key for is refused, naming it (``topology_problems``), except
what changes no estimate of what shardflow plans: SSD capacity (no key-value tables are planned)
and ``uneven_sharding_perf_multiplier`` (TorchRec's default estimator does not apply it), and the
numbers a profile holds (its backward multipliers, its host-to-GPU bandwidth), which go into the
planner's profile (``topology_profile``). TorchRec's
``HeuristicalStorageReservation`` also reserves memory for the model's dense parameters; shardflow's
topology has no key for it, so it comes off ``hbm_cap`` (``ddr_cap`` on cpu) such that each rank keeps
exactly the bytes TorchRec's reservation leaves; so do ``FixedAbsoluteStorageReservation``'s bytes,
and where a reservation (``FixedPercentageStorageReservation``, ``FixedAbsoluteStorageReservation``)
keeps no room for the input batches, which shardflow's always does, those bytes are given back
(``Reservation``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rec.cost.constants import HBM_TO_DDR_MEM_BW
from rec.cost.reservation import kjt_bytes, kjt_reserved
from rec.errors import InputError, Problem
from rec.profile.types import BWD_COMPUTE_MULTIPLIER, WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER, Profile
from rec.profile.validate import profile_problems
from rec.spec.types import Spec
from rec.topology import topology_from_dict
from rec.topology.types import Topology
from rec.topology.validate import MS_PER_S
from rec.torchrec_internals import reservation_absolute_bytes, reservation_dense, reservation_percentage
from rec.units import format_bytes
from rec.validation import Problems, finite_number, integer

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import Topology as TorchrecTopology

PARAMETER_MULTIPLIER = 6.0  # HeuristicalStorageReservation: parameters, optimizer state, DDP buckets
RESERVATION_PERCENTAGE = 0.15  # EmbeddingShardingPlanner's default reservation


def torchrec_topology(topology: Topology) -> TorchrecTopology:
    """TorchRec's ``Topology`` as ``rec.cost`` models it (no SSD tier, so no key_value)."""
    from torchrec.distributed.planner.types import Topology as TorchrecTopology

    made = TorchrecTopology(
        world_size=topology.world_size,
        compute_device=topology.compute_device.value,
        hbm_cap=topology.hbm_cap,
        ddr_cap=topology.ddr_cap,
        ssd_cap=0,
        local_world_size=topology.local_world_size,
        hbm_mem_bw=topology.hbm_mem_bw,
        ddr_mem_bw=topology.ddr_mem_bw,
        intra_host_bw=topology.intra_host_bw,
        inter_host_bw=topology.inter_host_bw,
    )
    for device in made.devices:  # TorchRec 1.6 reads ssd_cap=0 as its default, 2 TiB
        device.storage.ssd = 0
    return made


@dataclass(frozen=True)
class Reservation:
    """What a TorchRec storage reservation keeps free on each rank: ``percentage`` of HBM, and, for
    ``HeuristicalStorageReservation``, the dense parameters (``multiplier`` x their bytes, or its
    ``estimate``) and the input KJTs (``kjt``); ``FixedPercentageStorageReservation`` neither;
    ``FixedAbsoluteStorageReservation`` ``absolute`` bytes of HBM instead."""

    percentage: float = RESERVATION_PERCENTAGE
    multiplier: float = PARAMETER_MULTIPLIER
    estimate: int | None = None
    kjt: bool = True
    absolute: int | None = None

    def dense(self, module: Any, shardable: list[Any], input_kjt: int, spec: Spec, batch_size: int,
              cuda: bool) -> tuple[int, str]:
        """The bytes to take off each rank's capacity beside the percentage (``shardflow_topology``'s
        ``dense``), and what they are, for a message. shardflow's reservation always takes the input
        KJTs as its spec counts them (``rec.cost.reservation.kjt_bytes``); TorchRec's takes
        ``input_kjt`` (``torchrec_kjt_bytes``) or, where ``kjt`` is False, none: the difference is
        given back here (negative bytes where TorchRec keeps less free)."""
        given_back = (input_kjt if self.kjt else 0) - kjt_bytes(spec, batch_size)
        if self.absolute is not None:
            return ((self.absolute if cuda else 0) + given_back,
                    f"FixedAbsoluteStorageReservation's {format_bytes(self.absolute)}")
        if not self.kjt:
            return given_back, "the reservation"
        if self.estimate:  # as TorchRec: an estimate of 0 leaves its heuristic
            return (self.estimate + given_back,
                    f"the dense parameters ({format_bytes(self.estimate)}: your dense_tensor_estimate)")
        dense = dense_bytes(module, shardable, self.multiplier)
        return dense + given_back, (f"the dense parameters ({format_bytes(dense)}: {self.multiplier:g} x their "
                                    "bytes, TorchRec's heuristic); pass HeuristicalStorageReservation("
                                    "percentage, dense_tensor_estimate=...) if that overestimates")


def torchrec_kjt_bytes(inputs: list[tuple[list[float], list[int] | None]], batch_size: int) -> int:
    """TorchRec's reservation for the input KJTs (``_get_kjt_storage`` of
    ``_get_batch_inputs_and_shardable_parameters``): per shardable table in the model's order, its
    constraints' ``pooling_factors`` and ``batch_sizes`` (``inputs``; TorchRec's [1.0] and the batch
    size where it has none), 8 bytes an id, 20 copies."""
    lengths: list[float] = []
    sizes: list[int] = []
    for factors, given in inputs:
        lengths.extend(factors)
        sizes.extend(given or [batch_size] * len(factors))
    # As TorchRec: one list of every table's lengths, one of sizes, paired up to the shorter.
    return kjt_reserved([pf * bs for pf, bs in zip(lengths, sizes, strict=False)])


def reservation_settings(reservation: Any) -> tuple[Reservation, list[Problem]]:
    """A TorchRec storage reservation as shardflow reserves it, and what cannot be: None (TorchRec's
    default, ``HeuristicalStorageReservation(0.15)``), ``HeuristicalStorageReservation``,
    ``FixedPercentageStorageReservation`` and ``FixedAbsoluteStorageReservation``."""
    from torchrec.distributed.planner import storage_reservations as kinds

    if reservation is None:
        return Reservation(), []
    fixed = getattr(kinds, "FixedPercentageStorageReservation", None)
    absolute = getattr(kinds, "FixedAbsoluteStorageReservation", None)
    known = [k for k in (kinds.HeuristicalStorageReservation, fixed, absolute) if k is not None]
    if type(reservation) not in known:
        return Reservation(), [Problem(
            "storage_reservation", f"{type(reservation).__name__} is not supported: shardflow's cost model "
                                   f"reserves as TorchRec's {', '.join(k.__name__ for k in known)} do")]
    percentage = reservation_percentage(reservation)
    problems = []
    if not 0 <= percentage < 1:
        problems.append(Problem("storage_reservation", f"percentage {percentage:g} leaves no memory: it must be "
                                                       "in [0, 1)"))
    found = Problems("storage_reservation")  # each value as the validation grammar reads a number
    if type(reservation) is absolute:
        reserved = found.take("hbm_reserved_bytes", _bytes, reservation_absolute_bytes(reservation))
        problems += _reservation_problems(found)
        if reserved is None:
            return Reservation(), problems
        return Reservation(percentage, kjt=False, absolute=reserved), problems
    if type(reservation) is fixed:
        return Reservation(percentage, kjt=False), problems
    given, given_estimate = reservation_dense(reservation)
    multiplier = found.take("parameter_multiplier", lambda v: finite_number(v, minimum=0.0), given)
    estimate = None if given_estimate is None else found.take("dense_tensor_estimate", _bytes, given_estimate)
    problems += _reservation_problems(found)
    if problems or multiplier is None:
        return Reservation(), problems
    return Reservation(percentage, multiplier, estimate), problems


def _bytes(value: object) -> int:
    """A count of bytes as TorchRec's storage reservations hold one: a whole number >= 0."""
    return integer(value, "a whole number of bytes", minimum=0)


def _reservation_problems(found: Problems) -> list[Problem]:
    """``found``'s problems, each named by the reservation's argument."""
    return [Problem("storage_reservation", f"{p.where}: {p.reason}") for p in found.items]


def topology_problems(topology: Any) -> list[Problem]:
    """What of TorchRec's ``topology`` shardflow's topology cannot hold."""
    from torchrec.distributed.planner.types import Topology as TorchrecTopology

    if not isinstance(topology, TorchrecTopology):
        return [Problem("topology", f"expected TorchRec's Topology, got {type(topology).__name__}")]
    problems = []
    if not topology.devices:  # TorchRec builds world_size 0 and fails later, reading its first device
        problems.append(Problem("topology.world_size", f"{topology.world_size!r}: a topology needs a rank at least"))
    if topology.compute_device not in ("cpu", "cuda"):
        problems.append(Problem("topology.compute_device", f"{topology.compute_device!r}: shardflow plans for cpu "
                                                           "and cuda ranks"))
    for kind in ("hbm", "ddr"):
        try:
            caps = sorted({integer(getattr(d.storage, kind), "a whole number of bytes") for d in topology.devices})
        except ValueError as e:  # NaN, infinite, text: TorchRec's Storage holds bytes
            problems.append(Problem(f"topology {kind}_cap", str(e)))
            continue
        if len(caps) > 1:
            problems.append(Problem(f"topology {kind}_cap", (
                f"differs between ranks ({', '.join(format_bytes(c) for c in caps[:3])}): shardflow plans for ranks "
                "of one size")))
        elif caps and caps[0] <= 0 and (kind == "ddr" or topology.compute_device == "cuda"):
            problems.append(Problem(f"topology {kind}_cap", (
                f"{format_bytes(caps[0])}: a {topology.compute_device} rank keeps its tables' shards in "
                f"{kind.upper()}, so it needs some")))
    if getattr(topology, "intra_group_size", topology.local_world_size) != topology.local_world_size:
        problems.append(Problem("topology.pod_size", "a pod of several hosts is not modelled: shardflow's "
                                                     "topology has hosts of local_world_size ranks"))
    comms = getattr(topology, "comms_bandwidths", None)
    if comms is not None and type(comms).__name__ != "BasicCommsBandwidths":
        problems.append(Problem("topology.generalized_comms_bandwidths", (
            f"{type(comms).__name__} is not modelled: shardflow takes intra_host_bw and inter_host_bw")))
    for knob in PROFILE_KNOBS:
        value = getattr(topology, knob.name, knob.default)
        if not knob.allows(value):
            problems.append(Problem(f"topology.{knob.name}", f"{value!r} is not a number "
                                                             f"{'>= 0' if knob.may_be_zero else 'above 0'}"))
    return problems


@dataclass(frozen=True)
class ProfileKnob:
    """A number TorchRec's estimator reads from its ``Topology`` that shardflow's profile holds."""

    name: str  # the Topology attribute
    default: float  # TorchRec's
    field: str  # where in a profile: "coefficients.<name>" or "bandwidths.<name>"
    per_ms: bool = False  # TorchRec gives it in bytes/ms, a profile in bytes/s
    may_be_zero: bool = False

    def allows(self, value: object) -> bool:
        """A finite number above 0 (at least 0 where ``may_be_zero``)."""
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and (value >= 0 if self.may_be_zero else value > 0))


# TorchRec's default estimator reads these from the topology (EstimatorContext); a profile sets the same
# numbers. (uneven_sharding_perf_multiplier reaches only post_process_perfs, which TorchRec's default
# estimator leaves as it is: it changes no estimate.)
PROFILE_KNOBS = (
    ProfileKnob("bwd_compute_multiplier", BWD_COMPUTE_MULTIPLIER, "coefficients.bwd_compute_multiplier"),
    ProfileKnob("weighted_feature_bwd_compute_multiplier", WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER,
                "coefficients.weighted_feature_bwd_compute_multiplier", may_be_zero=True),
    ProfileKnob("hbm_to_ddr_mem_bw", HBM_TO_DDR_MEM_BW, "bandwidths.hbm_to_ddr_mem_bw", per_ms=True),
)


def topology_profile(profile: Profile, topology: Any) -> tuple[Profile, list[Problem]]:
    """``profile`` with each number TorchRec's ``topology`` sets away from TorchRec's default
    (``PROFILE_KNOBS``: its backward multipliers, its host-to-GPU bandwidth), so that the cost model
    prices what TorchRec's estimator prices under that topology. A profile other than TorchRec's
    default (a calibrated one) has its own numbers, fitted together: a problem where the topology
    sets another value (both were meant: say which)."""
    problems = []
    default = profile.is_default
    for knob in PROFILE_KNOBS:
        value = float(getattr(topology, knob.name, knob.default))
        if value == knob.default:
            continue
        part, name = knob.field.split(".")
        own = getattr(getattr(profile, part), name)
        wanted = value * MS_PER_S if knob.per_ms else value
        if default:
            profile = replace(profile, **{part: replace(getattr(profile, part), **{name: wanted})})
        elif own is None or abs(own - wanted) > 1e-9 * wanted:  # bytes/ms x 1000 may differ in the last bit
            theirs = "not set (TorchRec's default)" if own is None else f"{own:g}"
            shown = f"{value:g} bytes/ms ({wanted:g} bytes/s)" if knob.per_ms else f"{value:g}"
            problems.append(Problem(f"topology.{knob.name}", f"{shown}, but the profile's {knob.field} is {theirs}: "
                                                             "give it in one of them"))
    # what the topology set, held to a profile file's bounds (a multiplier of 2e6 priced every plan at
    # nonsense), named as the topology's setting
    knobs = {f"profile.{k.field}": k for k in PROFILE_KNOBS}
    for p in profile_problems(profile):
        set_by = knobs.get(p.where)
        if set_by is None:
            problems.append(p)
            continue
        given = float(getattr(topology, set_by.name, set_by.default))
        problems.append(Problem(f"topology.{set_by.name}", p.reason + (f" (the topology's {given:g} bytes/ms)"
                                                                       if set_by.per_ms else "")))
    return profile, problems


def shardflow_topology(topology: Any, batch_size: int, percentage: float, dense: int, dense_shown: str) -> Topology:
    """shardflow's topology for TorchRec's (checked by ``topology_problems``): ``batch_size`` per
    rank, ``percentage`` of HBM reserved, and ``dense`` bytes more (``dense_shown``: how a message
    names them, ``Reservation.dense``) taken off the capacity TorchRec's reservation takes them from.
    InputError if nothing is left."""
    cuda = topology.compute_device == "cuda"
    device = topology.devices[0].storage
    hbm, ddr = int(device.hbm) if cuda else 0, int(device.ddr)
    kind = "HBM" if cuda else "DDR"
    cap = hbm if cuda else ddr
    kept = int((1 - percentage) * hbm) if cuda else ddr  # the percentage comes off HBM only
    if kept <= 0:  # the capacity itself, not the dense parameters
        reserved = f" less the storage reservation's {percentage:.0%}" if cuda else ""
        raise InputError("The topology has no memory left for embedding tables:", [Problem(
            f"topology {kind.lower()}_cap", f"{format_bytes(cap)}{reserved} leaves each rank no {kind} for its "
                                            "tables' shards")])
    if cuda:
        hbm = _hbm_cap_left(hbm, percentage, dense)
    else:
        ddr -= dense
    if (hbm if cuda else ddr) <= 0:
        raise InputError("The topology has no memory left for embedding tables:", [Problem(
            "storage_reservation", f"nothing of each rank's {format_bytes(kept)} {kind} (topology "
                                   f"{kind.lower()}_cap {format_bytes(cap)}) is left after {dense_shown}")])
    return topology_from_dict({
        "world_size": topology.world_size, "local_world_size": topology.local_world_size,
        "compute_device": topology.compute_device, "hbm_cap": hbm, "ddr_cap": ddr,
        **{key: float(getattr(topology, key)) * MS_PER_S
           for key in ("intra_host_bw", "inter_host_bw", "hbm_mem_bw", "ddr_mem_bw")},
        "batch_size": batch_size, "storage_reservation": percentage,
    }, source="from TorchRec's Topology")


def _hbm_cap_left(hbm: int, percentage: float, dense: int) -> int:
    """The HBM capacity whose ``int((1 - percentage) * cap)`` is TorchRec's ``int((1 - percentage) *
    hbm) - dense``: the reservation shardflow applies then leaves what TorchRec's leaves."""
    target = int((1 - percentage) * hbm) - dense
    if dense == 0 or target <= 0:
        return hbm if dense == 0 else 0
    cap = math.floor(target / (1 - percentage))
    for candidate in range(cap - 2, cap + 4):  # (1 - p) * cap grows by at most 1 per byte: one of these
        if int((1 - percentage) * candidate) == target:
            return candidate
    return cap


def dense_bytes(module: Any, shardable: list[Any], multiplier: float) -> int:
    """TorchRec's ``_get_dense_tensor_size``: ``multiplier`` x the bytes of every parameter, plus
    buffers, of ``module`` less those of the ``shardable`` modules."""
    from torchrec.distributed.types import get_tensor_size_bytes

    def size(m: Any) -> int:
        total: float = (sum(multiplier * get_tensor_size_bytes(p) for p in m.parameters())
                        + sum(get_tensor_size_bytes(b) for b in m.buffers()))
        return round(total)

    return int(size(module) - sum(size(m) for m in shardable))
