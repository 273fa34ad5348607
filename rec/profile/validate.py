"""A profile mapping (as written in YAML) <-> a validated ``Profile``; its hash; its fit with a topology.

Every problem of a mapping is reported at once (``InputError``). ``profile_to_dict`` writes the
canonical form: keys at their defaults left out, numbers as floats, so that a profile written and
read back is equal to itself and a key added in a later version leaves existing hashes unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from typing import Any, TypeVar

from rec.errors import Problem, show
from rec.hashing import content_hash
from rec.profile.types import (
    SHARDING_COEFFICIENTS,
    Bandwidths,
    Coefficients,
    Extensions,
    KernelBandwidths,
    KernelCoefficients,
    Machine,
    PerfCoefficient,
    Profile,
    ShardingCoefficients,
)
from rec.sharding import NOT_PLANNED, ComputeDevice, ComputeKernel, ShardingType, is_available, sharder_options
from rec.topology.types import MAX_BANDWIDTH, MIN_BANDWIDTH, Topology
from rec.validation import (
    Problems,
    bandwidth,
    choice,
    finite_number,
    known_keys,
    positive_integer,
    validated,
)
from rec.validation import mapping as mapping_at
from rec.validation import name as text_name

PROFILE_FORMAT = "shardflow.profile/v1"
KEYS = ("format", "name", "bandwidths", "kernel_bandwidths", "coefficients", "extensions", "machine")
MULTIPLIER_KEYS = ("bwd_compute_multiplier", "weighted_feature_bwd_compute_multiplier", "weighted_kernel_multiplier")
COEFFICIENT_KEYS = (*dict.fromkeys(SHARDING_COEFFICIENTS.values()), "by_kernel", *MULTIPLIER_KEYS)
PASSES = ("fwd", "bwd")
MAX_FACTOR = 1e6  # coefficients, multipliers and factors: far above any fit, and keeps estimates finite
MAX_MS = 1e6  # fixed and latency terms: 1,000 s per shard
MAX_NAME = 200
PLANNED_KERNELS = tuple(k for k in ComputeKernel if k not in NOT_PLANNED)
PLANNED_TYPES = tuple(s for s in ShardingType if s not in NOT_PLANNED)

D = TypeVar("D")


def profile_from_dict(d: object, source: str = "profile") -> Profile:
    """Validate a profile mapping (YAML keys and units) into a ``Profile``; InputError naming every problem."""
    return validated(read_profile_mapping, d, source, "profile")


def read_profile_mapping(d: object, problems: Problems) -> Profile | None:
    """The ``Profile`` of mapping ``d``, or None with every problem recorded in ``problems`` (a plan
    reader's collector names them ``planner.profile.KEY``)."""
    if not isinstance(d, Mapping):
        problems.add("", f"expected a mapping of keys ({', '.join(KEYS)}), got {show(d)}")
        return None
    before = len(problems.items)
    d = known_keys(d, KEYS, problems)
    if "format" in d and d["format"] != PROFILE_FORMAT:
        problems.add("format", f"expected {PROFILE_FORMAT!r}, got {show(d['format'])}")
    profile = Profile(
        name=_text(d.get("name"), "name", problems),
        bandwidths=_section(d, "bandwidths", Bandwidths, _bandwidth, problems),
        kernel_bandwidths=_section(d, "kernel_bandwidths", KernelBandwidths, _bandwidth, problems),
        coefficients=_coefficients(d.get("coefficients"), problems),
        extensions=_extensions(d.get("extensions"), problems),
        machine=_machine(d.get("machine"), problems),
    )
    return None if len(problems.items) > before else profile


def profile_problems(profile: object, prefix: str = "profile.") -> list[Problem]:
    """What a ``Profile`` built in code (not read from a file) holds out of the bounds a profile file
    is held to, each named ``PREFIX + its YAML key``: the same checks, on its canonical YAML form."""
    if not isinstance(profile, Profile):
        return [Problem(prefix.rstrip("."), f"expected a Profile or a profile file's path, got "
                                            f"{type(profile).__name__}")]
    try:
        written = profile_to_dict(profile)
    except (AttributeError, TypeError, ValueError) as e:  # fields of other types than a Profile's
        return [Problem(prefix.rstrip("."), f"is not a well-formed Profile ({type(e).__name__}: {str(e)[:100]})")]
    problems = Problems(root=prefix.rstrip("."), prefix=prefix)
    read_profile_mapping(written, problems)
    return list(problems.items)


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The canonical YAML form of ``profile`` (bandwidths in bytes/s, defaults left out):
    ``profile_from_dict`` reads it back equal."""
    out: dict[str, Any] = {"format": PROFILE_FORMAT}
    if profile.name is not None:
        out["name"] = profile.name
    for key in ("bandwidths", "kernel_bandwidths", "extensions"):
        section = _changed(getattr(profile, key))
        if section:
            out[key] = section
    coefficients = _coefficients_to_dict(profile.coefficients)
    if coefficients:
        out["coefficients"] = coefficients
    if profile.machine is not None:
        out["machine"] = {k: (v.value if isinstance(v, ComputeDevice) else v)
                          for k, v in dataclasses.asdict(profile.machine).items() if v is not None}
    return out


def profile_hash(profile: Profile) -> str:
    """16 hex digits of sha256 over the canonical form (``profile_to_dict``) as canonical JSON."""
    return content_hash(profile_to_dict(profile))


def profile_record(profile: Profile) -> dict[str, Any]:
    """What a plan records of the profile it was made under: its hash and its canonical form."""
    return {"hash": profile_hash(profile), **profile_to_dict(profile)}


def profile_from_record(record: object, source: str) -> Profile:
    """The profile of ``profile_record``; InputError if invalid or its content does not give its hash."""
    return validated(read_profile_record, record, source, "profile")


def read_profile_record(record: object, problems: Problems) -> Profile | None:
    """The profile of ``profile_record``, or None with every problem recorded: invalid, or edited (its
    content does not give its hash)."""
    if not isinstance(record, Mapping) or not isinstance(record.get("hash"), str):
        problems.add("", "expected a mapping with a hash")
        return None
    profile = read_profile_mapping({k: v for k, v in record.items() if k != "hash"}, problems)
    if profile is not None and profile_hash(profile) != record["hash"]:
        problems.add("hash", f"the profile's content hashes to {profile_hash(profile)}, not its hash "
                             f"{show(record['hash'])}: it was edited")
        return None
    return profile


def check_profile_for(profile: Profile, topology: Topology, source: str = "profile") -> None:
    """InputError if ``profile`` describes another kind of device than the topology plans for."""
    problems = Problems()
    profile_problems_for(profile, topology, problems, f"{source} ")
    problems.raise_if_any(f"The {source} describes other ranks than the topology's:")


def profile_problems_for(profile: Profile, topology: Topology, problems: Problems, label: str = "") -> None:
    """Record where ``profile`` describes another kind of device than ``topology``'s ranks: its
    ``machine.device``, a kernel bandwidth for a kernel those ranks do not run."""
    device = topology.compute_device
    if profile.machine is not None and profile.machine.device != device:
        problems.add(f"{label}machine.device", (
            f"the profile was measured on {profile.machine.device.value}, the topology plans for {device.value}: "
            f"use a profile measured on {device.value} ranks (shardflow calibrate), or plan without one"))
    kernels = {k for ks in sharder_options(device).values() for k in ks}
    for kernel in PLANNED_KERNELS:
        if profile.kernel_bandwidths.of(kernel) is not None and kernel not in kernels:
            problems.add(f"{label}kernel_bandwidths.{kernel.value}",
                         f"no {device.value} rank runs the {kernel.value} kernel (a profile for another device?)")


def describe_profile(profile: Profile) -> str:
    """One line for a person: the profile's name and hash, what it sets, where it was measured."""
    d = profile_to_dict(profile)
    parts = [f"{profile.name or 'unnamed'} (hash {profile_hash(profile)})"]
    sets = [f"{key} {', '.join(d[key])}" for key in ("bandwidths", "kernel_bandwidths", "coefficients", "extensions")
            if key in d]
    if "bandwidths" in d:
        sets[0] += " (in place of the topology's)"
    parts.append("; ".join(sets) if sets else "TorchRec's defaults")
    m = profile.machine
    if m is not None:
        ranks = f", {m.world_size} ranks" if m.world_size else ""
        parts.append(f"measured on {m.device.value}{ranks}{f' at {m.measured_at}' if m.measured_at else ''}")
    return "; ".join(parts)


# ---------------------------------------------------------------- reading


def _known_keys(d: Mapping[Any, Any], keys: tuple[str, ...], prefix: str, problems: Problems) -> dict[str, Any]:
    """The known keys of ``d`` (the mapping at ``prefix``); a problem for each key that is not text or unknown."""
    return known_keys(d, keys, problems.within(prefix.rstrip(".")) if prefix else problems)


def _mapping(value: object, where: str, problems: Problems) -> Mapping[Any, Any] | None:
    return mapping_at(value, problems, where)


def _section(d: Mapping[str, Any], key: str, cls: type[D], parse: Callable[[object], float],
             problems: Problems) -> D:
    """A dataclass of optional numbers from the mapping ``d[key]`` (absent keys: None)."""
    mapping = _mapping(d.get(key), key, problems)
    if mapping is None:
        return cls()
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    values = {}
    for name, raw in _known_keys(mapping, names, f"{key}.", problems).items():
        if raw is None:
            continue
        try:
            values[name] = parse(raw)
        except ValueError as e:
            problems.add(f"{key}.{name}", str(e))
    return cls(**values)


def _bandwidth(value: object) -> float:
    return bandwidth(value, minimum=MIN_BANDWIDTH, maximum=MAX_BANDWIDTH)


def _number(maximum: float) -> Callable[[object], float]:
    def parse(value: object) -> float:
        return finite_number(value, minimum=0, maximum=maximum)

    return parse


_FACTOR = _number(MAX_FACTOR)
_MS = _number(MAX_MS)


def _fields_of(cls: type[Any], mapping: Mapping[str, Any], where: str, problems: Problems,
               parsers: Mapping[str, Callable[[object], float]]) -> dict[str, float]:
    values = {}
    for name, raw in _known_keys(mapping, tuple(f.name for f in dataclasses.fields(cls)), f"{where}.",
                                 problems).items():
        try:
            values[name] = parsers[name](raw)
        except ValueError as e:
            problems.add(f"{where}.{name}", str(e))
    return values


def _perf_coefficient(value: object, where: str, problems: Problems) -> PerfCoefficient:
    if value is None:  # "fwd:" with nothing after it
        return PerfCoefficient()
    mapping = _mapping(value, where, problems)
    if mapping is None:
        return PerfCoefficient()
    parsers = {f.name: (_MS if f.name == "fixed_ms" else _FACTOR) for f in dataclasses.fields(PerfCoefficient)}
    return PerfCoefficient(**_fields_of(PerfCoefficient, mapping, where, problems, parsers))


def _sharding_coefficients(value: object, where: str, problems: Problems) -> ShardingCoefficients:
    mapping = _mapping(value, where, problems) if value is not None else {}
    if mapping is None:
        return ShardingCoefficients()
    mapping = _known_keys(mapping, PASSES, f"{where}.", problems)
    fwd = _perf_coefficient(mapping.get("fwd"), f"{where}.fwd", problems)
    # An absent (or null) bwd is TorchRec's None: backward = forward x bwd_compute_multiplier.
    bwd = None if mapping.get("bwd") is None else _perf_coefficient(mapping["bwd"], f"{where}.bwd", problems)
    return ShardingCoefficients(fwd, bwd)


def _coefficients(value: object, problems: Problems) -> Coefficients:
    mapping = _mapping(value, "coefficients", problems)
    if mapping is None:
        return Coefficients()
    mapping = _known_keys(mapping, COEFFICIENT_KEYS, "coefficients.", problems)
    values: dict[str, Any] = {
        key: _sharding_coefficients(mapping[key], f"coefficients.{key}", problems)
        for key in dict.fromkeys(SHARDING_COEFFICIENTS.values()) if key in mapping
    }
    for key in MULTIPLIER_KEYS:
        if key in mapping:
            try:
                values[key] = _FACTOR(mapping[key])
            except ValueError as e:
                problems.add(f"coefficients.{key}", str(e))
    values["by_kernel"] = _by_kernel(mapping.get("by_kernel"), problems)
    return Coefficients(**values)


def _by_kernel(value: object, problems: Problems) -> tuple[KernelCoefficients, ...]:
    """``{sharding_type: {kernel: {fwd: ..., bwd: ...}}}`` -> entries in (sharding type, kernel) order."""
    mapping = _mapping(value, "coefficients.by_kernel", problems)
    if mapping is None:
        return ()
    entries = []
    types = tuple(s.value for s in PLANNED_TYPES)
    kernels = tuple(k.value for k in PLANNED_KERNELS)
    for st, per_kernel in _known_keys(mapping, types, "coefficients.by_kernel.", problems).items():
        where = f"coefficients.by_kernel.{st}"
        inner = _mapping(per_kernel, where, problems)
        if inner is None:
            continue
        for ck, coefficients in _known_keys(inner, kernels, f"{where}.", problems).items():
            if not any(is_available(d, ShardingType(st), ComputeKernel(ck)) for d in ComputeDevice):
                problems.add(f"{where}.{ck}", f"{st} never runs on the {ck} kernel, so this would never apply")
                continue
            entries.append(KernelCoefficients(ShardingType(st), ComputeKernel(ck),
                                              _sharding_coefficients(coefficients, f"{where}.{ck}", problems)))
    order = {(s, k): i for i, (s, k) in enumerate((s, k) for s in ShardingType for k in ComputeKernel)}
    return tuple(sorted(entries, key=lambda e: order[(e.sharding_type, e.compute_kernel)]))


def _extensions(value: object, problems: Problems) -> Extensions:
    mapping = _mapping(value, "extensions", problems)
    if mapping is None:
        return Extensions()
    parsers = {f.name: (_MS if f.name.endswith("_ms") else _FACTOR) for f in dataclasses.fields(Extensions)}
    values: dict[str, Any] = _fields_of(Extensions, {k: v for k, v in mapping.items() if k not in PER_TYPE},
                                        "extensions", problems, parsers)
    for key in PER_TYPE:
        if mapping.get(key) is not None:
            values[key] = _sharding_type_ms(mapping[key], f"extensions.{key}", problems)
    return Extensions(**values)


PER_TYPE = ("sharding_type_ms", "module_sharding_type_ms")  # extensions given as {sharding_type: ms}


def _sharding_type_ms(value: object, where: str, problems: Problems) -> tuple[tuple[ShardingType, float], ...]:
    """``{sharding_type: ms}`` -> pairs in ShardingType order."""
    mapping = _mapping(value, where, problems)
    if mapping is None:
        return ()
    found = {}
    for st, ms in _known_keys(mapping, tuple(s.value for s in PLANNED_TYPES), f"{where}.", problems).items():
        try:
            found[ShardingType(st)] = _MS(ms)
        except ValueError as e:
            problems.add(f"{where}.{st}", str(e))
    return tuple((st, found[st]) for st in ShardingType if found.get(st))  # 0 is no entry: one form each


def _machine(value: object, problems: Problems) -> Machine | None:
    mapping = _mapping(value, "machine", problems)
    if mapping is None:
        return None
    keys = tuple(f.name for f in dataclasses.fields(Machine))
    mapping = _known_keys(mapping, keys, "machine.", problems)
    device = None
    if mapping.get("device") is None:
        problems.add("machine.device", f"is required: {' or '.join(d.value for d in ComputeDevice)}")
    else:
        device = problems.take("machine.device", lambda v: choice(ComputeDevice, v), mapping["device"])
    values: dict[str, Any] = {k: _text(mapping.get(k), f"machine.{k}", problems)
                              for k in ("device_name", "torch_version", "fbgemm_version")}
    for key in ("world_size", "local_world_size"):
        values[key] = None if mapping.get(key) is None else \
            problems.take(f"machine.{key}", positive_integer, mapping[key])
    world, local = values["world_size"], values["local_world_size"]
    if world is not None and local is not None and world % local:
        problems.add("machine.local_world_size", f"world_size {world} is not a multiple of local_world_size {local}")
    if mapping.get("measured_at") is not None:
        values["measured_at"] = problems.take("machine.measured_at", _timestamp, mapping["measured_at"])
    if device is None:
        return None
    return Machine(device=device, **values)


def _text(value: object, where: str, problems: Problems) -> str | None:
    if value is None:
        return None
    return problems.take(where, lambda v: text_name(v, max_length=MAX_NAME, hint=" (write it in quotes, e.g. '2.5.1')"),
                         value)


def _timestamp(value: object) -> str:
    """ISO 8601 text, normalized (YAML reads an unquoted timestamp as a date or datetime)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"expected an ISO 8601 time (e.g. 2025-06-01T12:00:00Z), got {show(value)}") from None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime.combine(value, time())
    if not isinstance(value, datetime):
        raise ValueError(f"expected an ISO 8601 time, got {show(value)}")
    return value.isoformat()


# ---------------------------------------------------------------- writing


def _changed(section: Any) -> dict[str, Any]:
    """The fields of a dataclass of numbers that differ from its defaults."""
    default = type(section)()
    return {f.name: _plain(getattr(section, f.name)) for f in dataclasses.fields(section)
            if getattr(section, f.name) != getattr(default, f.name)}


def _plain(value: Any) -> Any:
    """A number as a float; pairs of (enum, number) as a mapping (``sharding_type_ms``)."""
    if isinstance(value, tuple):
        return {key.value: float(number) for key, number in value}
    return float(value)


def _sharding_to_dict(c: ShardingCoefficients, always: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fwd = _changed(c.fwd)
    if fwd or always:
        out["fwd"] = fwd
    if c.bwd is not None:
        out["bwd"] = _changed(c.bwd)  # {} too: present means "not forward x multiplier"
    return out


def _coefficients_to_dict(c: Coefficients) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in dict.fromkeys(SHARDING_COEFFICIENTS.values()):
        value = getattr(c, key)
        if value != ShardingCoefficients():
            out[key] = _sharding_to_dict(value)
    if c.by_kernel:
        by_kernel: dict[str, dict[str, Any]] = {}
        for e in c.by_kernel:
            by_kernel.setdefault(e.sharding_type.value, {})[e.compute_kernel.value] = \
                _sharding_to_dict(e.coefficients, always=True)
        out["by_kernel"] = by_kernel
    for key in MULTIPLIER_KEYS:
        if getattr(c, key) != getattr(Coefficients(), key):
            out[key] = float(getattr(c, key))
    return out


def dumps_profile(profile: Profile) -> str:
    """The profile as YAML text (canonical form, keys in a fixed order): what calibration writes."""
    import yaml

    header = f"# shardflow hardware profile (docs/profile.md); hash {profile_hash(profile)}\n"
    body: str = yaml.safe_dump(profile_to_dict(profile), sort_keys=False, default_flow_style=False,
                               allow_unicode=False, width=100)
    return header + body

