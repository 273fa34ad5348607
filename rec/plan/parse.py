"""plan.json -> a typed ``Plan``, every key and value checked once, every problem named.

A plan read back (a file, the plan cache, MLflow, what rank 0 sent) is validated like the user's own
inputs (``rec.validation``): its topology as a topology file is, its spec as a spec file, its
profile as a profile file, and every table, shard and metric for type and range, so that nothing
downstream meets a value of the wrong type (a traceback) or one too large for 64-bit arithmetic.
The content is checked against the declared ``format`` (a v3 plan relabelled v2 is refused), the
embedded profile against the topology, and the spec, topology and planner against the plan's
``spec_hash`` and ``plan_id``. Whether the plan is sound and its metrics true is
``rec.analysis.check_plan``'s to say.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from rec.config.cost import CostConfig
from rec.config.planner_identity import MadeBy, Planner, PlannerIdentity
from rec.config.search import KNOBS_ADDED_LATER, SearchConfig
from rec.cost.tables import CacheRule
from rec.errors import InputError, Problem, show
from rec.plan.metrics import UNKNOWN_BOUND, BoundMethod, Movement, PlanMetrics
from rec.plan.parse_tables import MAX_NAME, byte_count, milliseconds, read_tables, record
from rec.plan.plan_id import identity_problems
from rec.plan.types import (
    PLAN_FORMAT,
    PLAN_FORMAT_CACHES,
    PLAN_FORMAT_MODULES,
    PLAN_FORMAT_PLACED,
    PLAN_FORMAT_UNSTATED,
    PLAN_FORMAT_V1,
    PLAN_FORMATS,
    Plan,
    TablePlan,
)
from rec.profile import DEFAULT_PROFILE, Profile
from rec.profile.validate import profile_problems_for, read_profile_record
from rec.spec import spec_from_rows
from rec.spec.types import DEFAULT_MODULE, Spec
from rec.topology.types import Topology
from rec.topology.validate import KEYS as TOPOLOGY_KEYS
from rec.topology.validate import REQUIRED as TOPOLOGY_REQUIRED
from rec.topology.validate import read_topology_mapping
from rec.validation import (
    Problems,
    boolean,
    choice,
    finite_number,
    integer,
    known_keys,
    name,
    number_value,
    one_of_values,
    positive_integer,
    required,
    text_list,
)

TOP_KEYS = ("format", "plan_id", "spec_hash", "previous_plan_id", "topology", "planner", "tables", "metrics", "spec")
REQUIRED_KEYS = ("plan_id", "spec_hash", "topology", "planner", "tables", "metrics", "spec")
PLANNER_KEYS = ("cost", "search", "backend", "groups", "previous_plan_id", "max_regress", "profile", "made_by")
BACKENDS = ("ray", "auto")  # a plan searched in this process records no backend
MADE_BY_KEYS = ("name", "torchrec", "proposers", "seconds")
RANK_METRICS = ("rank_perf", "rank_hbm", "rank_ddr", "rank_hbm_cap", "rank_ddr_cap")
METRIC_KEYS = ("critical_path", "lower_bound", "gap", *RANK_METRICS, "bound_method", "optimal", "movement")
V1_METRIC_KEYS = (*METRIC_KEYS, "planning_s")  # v1's bound_method and optimal are named as such below
HASH = re.compile(r"[0-9a-f]{16}")


def plan_from_dict(d: object, source: str = "plan") -> Plan:
    """The ``Plan`` a plan.json payload holds; InputError naming every problem if it is not a valid one."""
    if not isinstance(d, dict) or d.get("format") not in PLAN_FORMATS:
        got = d.get("format") if isinstance(d, dict) else f"a JSON {type(d).__name__}"
        raise InputError(f"{source} is not a shardflow plan:",
                         [Problem("format", f"expected one of {', '.join(PLAN_FORMATS)}, got {show(got)}")])
    problems = Problems(root=source)
    plan = _plan(d, d["format"], problems)
    problems.raise_if_any(f"{source} is not a valid shardflow plan:")
    assert plan is not None
    return plan


def parse_plan(text: str | bytes, path: str | Path) -> Plan:
    """The plan in plan.json's ``text`` (read from ``path``); InputError if it is not one."""
    from rec.documents import DocumentError, load_json

    try:
        # Not orjson, which keeps the last of a key written twice: a duplicate in a table's shards or
        # estimates changes what the plan_id does not cover. The strict reader costs ~6% of reading a plan.
        payload = load_json(text, finite=True)
    except DocumentError as e:
        raise InputError(f"Cannot read the plan {path}:", [Problem(str(path), str(e))]) from None
    return plan_from_dict(payload, str(path))


def _plan(d: dict[Any, Any], declared: str, problems: Problems) -> Plan | None:
    d = known_keys(d, TOP_KEYS, problems)
    required(d, REQUIRED_KEYS, problems)
    ids = {key: problems.take(key, _hash, d[key]) for key in ("plan_id", "spec_hash", "previous_plan_id")
           if d.get(key) is not None}
    topology = None if d.get("topology") is None else _topology(d["topology"], problems.within("topology"))
    planner = None if d.get("planner") is None else _planner(d["planner"], problems.within("planner"))
    spec = None if d.get("spec") is None else _spec(d["spec"], problems)
    world = topology.world_size if topology is not None else None
    v1 = declared == PLAN_FORMAT_V1
    tables = None if d.get("tables") is None else read_tables(d["tables"], world, v1, problems)
    metrics = None if d.get("metrics") is None else _metrics(d["metrics"], world, v1, problems.within("metrics"))
    if tables is not None and spec is not None:
        _check_format(declared, tables, spec, problems)
    if topology is not None and planner is not None:
        profile_problems_for(planner.profile, topology, problems.within("planner.profile"))
    if planner is not None and ids.get("previous_plan_id") != planner.previous_plan_id:
        problems.add("previous_plan_id", f"says {ids.get('previous_plan_id')}, the planner (which the plan_id "
                                         f"covers) {planner.previous_plan_id}: one of them was edited")
    if problems or topology is None or planner is None or spec is None or tables is None or metrics is None:
        return None
    plan = Plan(ids["plan_id"] or "", ids["spec_hash"] or "", topology, planner, tables, metrics, spec,
                ids.get("previous_plan_id"))
    problems.items += identity_problems(plan)  # the spec, topology and planner give its ids
    rule = _planned_rule(plan, declared) if plan.caches else CacheRule.PLACED
    if rule is not CacheRule.PLACED and plan.rules_differ(rule):
        plan = replace(plan, cache_rule=rule)  # planned so: its caches state their sizes as then
    if declared == PLAN_FORMAT_UNSTATED and plan.format != declared:
        problems.add("format", f"says {declared}, but no cache of TorchRec's default size goes unstated beside "
                               f"another size: such a plan is {plan.format}")
    elif declared == PLAN_FORMAT_PLACED and plan.format != declared:
        problems.add("format", f"says {declared}, but it states no fewer caches than {plan.format} does: "
                               f"such a plan is {plan.format}")
    return plan


def _planned_rule(plan: Plan, declared: str) -> CacheRule:
    """The rule a plan of the ``declared`` format was costed and is built by (rec.cost.tables.CacheRule):
    v6's own; v5's; every cache stated in v4; before, v5's unless that leaves a cache unstated that the
    plan states (it was made before v5)."""
    if declared == PLAN_FORMAT_PLACED:
        return CacheRule.PLACED
    if declared == PLAN_FORMAT_UNSTATED:
        return CacheRule.GROUP
    if declared == PLAN_FORMAT_CACHES or plan.rules_differ(CacheRule.EVERY, CacheRule.GROUP, caching_only=True):
        return CacheRule.EVERY
    return CacheRule.GROUP


def _topology(d: object, problems: Problems) -> Topology | None:
    """The plan's topology: a topology file's keys, every one of them (a plan records it normalized)."""
    if isinstance(d, Mapping):
        for key in TOPOLOGY_KEYS:
            if key not in d and key not in TOPOLOGY_REQUIRED:  # those the topology's own check names
                problems.add(key, "is required: a plan records its topology with every key")
    return read_topology_mapping(d, problems)


def _check_format(declared: str, tables: Sequence[TablePlan], spec: Spec, problems: Problems) -> None:
    """Only a plan with a table whose cache size the planner chose is v4 (or v6), and only one with a
    table outside the default module (and none such) is v3 (or v5, v6); v1 and v2 have neither."""
    cached = next((t.key for t in tables if t.cache_load_factor is not None), None)
    if declared == PLAN_FORMAT_PLACED:
        return  # with chosen sizes and modules or without; what makes it v6 is checked once it is read
    if cached is not None or declared == PLAN_FORMAT_CACHES:
        if cached is None:
            problems.add("format", f"says {declared}, but no table has a cache_load_factor: such a plan is "
                                   f"{PLAN_FORMAT} or {PLAN_FORMAT_MODULES}")
        elif declared != PLAN_FORMAT_CACHES:
            problems.add("format", f"says {declared}, but table {cached} has a cache_load_factor: such a plan is "
                                   f"{PLAN_FORMAT_CACHES}")
        return
    keys = [t.key for t in tables if t.module != DEFAULT_MODULE] + [t.key for t in spec.tables
                                                                   if t.module != DEFAULT_MODULE]
    outside = keys[0] if keys else None
    if outside is not None and declared not in (PLAN_FORMAT_MODULES, PLAN_FORMAT_UNSTATED):
        problems.add("format", f"says {declared}, but table {outside} is in a module other than the default: "
                               f"such a plan is {PLAN_FORMAT_MODULES}")
    if outside is None and declared == PLAN_FORMAT_MODULES:
        problems.add("format", f"says {declared}, but every table is in the default module: such a plan is "
                               f"{PLAN_FORMAT}")


# ---------------------------------------------------------------- the planner identity


def _planner(record_: object, problems: Problems) -> PlannerIdentity | None:
    before = len(problems.items)
    d = record(record_, PLANNER_KEYS, problems)
    if d is None:
        return None
    required(d, ("cost",), problems)
    cost = None if d.get("cost") is None else _settings(CostConfig, d["cost"], problems.within("cost"),
                                                         skip=("profile",))
    profile: Profile | None = DEFAULT_PROFILE
    if d.get("profile") is not None:
        profile = read_profile_record(d["profile"], problems.within("profile"))
    search: SearchConfig | None = None
    unrecorded: tuple[str, ...] = ()
    if d.get("search") is not None:
        search, unrecorded = _search(d["search"], problems.within("search"))
    made_by = None if d.get("made_by") is None else _made_by(d["made_by"], problems.within("made_by"))
    if d.get("search") is None and d.get("made_by") is None:
        problems.add("search", "is required: a plan of shardflow's search records its knobs (another "
                               "planner's plan names it in made_by)")
    if d.get("search") is not None and d.get("made_by") is not None:
        problems.add("made_by", "a plan another planner made has no search knobs (planner.search)")
    backend = _pair(d, "backend", "groups", problems)
    replan = _pair(d, "previous_plan_id", "max_regress", problems)
    values: dict[str, Any] = {}
    if backend:
        values["backend"] = problems.take("backend", one_of_values(BACKENDS), d["backend"])
        if d["groups"] is not None:
            values["groups"] = problems.take("groups", positive_integer, d["groups"])
    if replan:
        values["previous_plan_id"] = problems.take("previous_plan_id", _hash, d["previous_plan_id"])
        values["max_regress"] = problems.take("max_regress", _fraction, d["max_regress"])
    if len(problems.items) > before or cost is None or profile is None:
        return None
    return PlannerIdentity(cost=replace(cost, profile=profile), search=search, made_by=made_by,
                           unrecorded=unrecorded, **values)


def _search(record_: object, problems: Problems) -> tuple[SearchConfig | None, tuple[str, ...]]:
    """The search's knobs, and those the plan predates (``KNOBS_ADDED_LATER``: absent, read as the
    search of that time; an edit that drops a knob changes the plan_id, which the plan is checked by)."""
    if not isinstance(record_, Mapping):
        return _settings(SearchConfig, record_, problems), ()
    unrecorded = tuple(k for k in KNOBS_ADDED_LATER if k not in record_)
    filled = {**record_, **{k: KNOBS_ADDED_LATER[k] for k in unrecorded}}
    return _settings(SearchConfig, filled, problems), unrecorded


def _pair(d: Mapping[str, Any], first: str, second: str, problems: Problems) -> bool:
    """Whether ``d`` has both keys (a problem if it has only one): they are written together."""
    has = first in d, second in d
    if has[0] != has[1]:
        present, absent = (first, second) if has[0] else (second, first)
        problems.add(absent, f"is required with {present}")
    return all(has)


def _settings(cls: type[Any], record_: object, problems: Problems, skip: tuple[str, ...] = ()) -> Any:
    """An instance of the settings dataclass ``cls`` from every one of its fields (but ``skip``),
    each within its knob's bounds; None, with the problems recorded, otherwise. A number keeps the
    form it was written in (5 or 5.0), as the plan_id covers it."""
    names = tuple(f.name for f in fields(cls) if f.name not in skip)
    d = record(record_, names, problems)
    if d is None:
        return None
    required(d, names, problems)
    values: dict[str, Any] = {}
    before = len(problems.items)
    for f in fields(cls):
        if f.name in skip or d.get(f.name) is None:
            continue
        low, high = f.metadata.get("minimum"), f.metadata.get("maximum")
        default = f.default
        rule: Callable[[object], object]
        if isinstance(default, Enum):
            rule = _enum_rule(type(default))
        elif isinstance(default, bool):
            rule = boolean
        elif isinstance(default, int):
            rule = _int_rule(low, high)
        else:
            rule = _number_rule(low, high)
        values[f.name] = problems.take(f.name, rule, d[f.name])
    if len(problems.items) > before or set(values) != set(names):
        return None
    return cls(**values)


def _enum_rule(enum: type[Enum]) -> Callable[[object], object]:
    return lambda value: choice(enum, value)


def _int_rule(low: float | None, high: float | None) -> Callable[[object], object]:
    return lambda value: integer(value, minimum=None if low is None else int(low),
                                 maximum=None if high is None else int(high))


def _number_rule(low: float | None, high: float | None) -> Callable[[object], int | float]:
    def rule(value: object) -> int | float:
        finite_number(value, minimum=low, maximum=high)
        return number_value(value)  # as written: 5 and 5.0 give different plan_ids

    return rule


def _made_by(record_: object, problems: Problems) -> MadeBy | None:
    d = record(record_, MADE_BY_KEYS, problems)
    if d is None:
        return None
    required(d, MADE_BY_KEYS, problems)
    others = one_of_values([p.value for p in Planner if p is not Planner.SHARDFLOW])
    planner = problems.take_from(d, "name", lambda v: Planner(others(v)))
    version = problems.take_from(d, "torchrec", lambda v: name(v, max_length=MAX_NAME))
    proposers = problems.take_from(d, "proposers", text_list)
    seconds = problems.take_from(d, "seconds", _number_rule(0.0, None))
    if planner is None or version is None or proposers is None or seconds is None:
        return None
    return MadeBy(planner, version, proposers, seconds)


# ---------------------------------------------------------------- the spec


def _spec(rows: object, problems: Problems) -> Spec | None:
    if not isinstance(rows, list):
        problems.add("spec", f"expected a list of table rows, got {show(rows)}")
        return None
    try:
        return spec_from_rows(rows, source="in the plan")
    except InputError as e:
        for p in e.problems:
            problems.add("spec", str(p))
        return None


# ---------------------------------------------------------------- metrics


def _metrics(record_: object, world: int | None, v1: bool, problems: Problems) -> PlanMetrics | None:
    before = len(problems.items)
    d = record(record_, V1_METRIC_KEYS if v1 else METRIC_KEYS, problems, new_in_v2=("bound_method", "optimal"),
               v1=v1)
    if d is None:
        return None
    required(d, (*METRIC_KEYS[:8], *(() if v1 else ("bound_method", "optimal"))), problems)
    if v1 and d.get("planning_s") is not None:
        problems.take("planning_s", milliseconds, d["planning_s"])  # measured seconds, not kept
    values: dict[str, Any] = {key: problems.take_from(d, key, _finite)
                              for key in ("critical_path", "lower_bound", "gap")}
    for key in RANK_METRICS:
        if d.get(key) is not None and world is not None:
            kind = "numbers" if key == "rank_perf" else "integers (bytes)"
            rule = milliseconds if key == "rank_perf" else byte_count
            values[key] = _per_rank(d[key], world, rule, f"{key} must list {world:,} {kind}, one per rank", problems)
    bound: BoundMethod | Literal["unknown"] | None = UNKNOWN_BOUND
    if d.get("bound_method") is not None:
        bound = problems.take("bound_method", _bound_method, d["bound_method"])
    optimal = False if d.get("optimal") is None else problems.take("optimal", boolean, d["optimal"])
    movement = None
    if d.get("movement") is not None and world is not None:
        movement = _movement(d["movement"], world, problems.within("movement"))
    if len(problems.items) > before or world is None or bound is None or optimal is None:
        return None
    return PlanMetrics(**values, bound_method=bound, optimal=optimal, movement=movement)


def _per_rank(value: object, world: int, rule: Callable[[object], Any], reason: str,
              problems: Problems) -> tuple[Any, ...] | None:
    """One value per rank, each valid under ``rule``; the problem named at ``metrics``."""
    try:
        if isinstance(value, list) and len(value) == world:
            return tuple(rule(v) for v in value)
    except ValueError as e:
        problems.add("", f"{reason}: {e}")
        return None
    problems.add("", f"{reason}, got {show(value)}")
    return None


def _movement(record_: object, world: int, problems: Problems) -> Movement | None:
    names = tuple(f.name for f in fields(Movement))
    d = record(record_, names, problems)
    if d is None:
        return None
    counts = names[:8]  # the byte and table counts; then fresh_critical_path, bytes_in, bytes_out
    required(d, counts, problems)
    values: dict[str, Any] = {key: problems.take_from(d, key, byte_count) for key in counts}
    if d.get("fresh_critical_path") is not None:
        values["fresh_critical_path"] = problems.take("fresh_critical_path", milliseconds, d["fresh_critical_path"])
    for key in ("bytes_in", "bytes_out"):
        if d.get(key) is not None:
            values[key] = _per_rank(d[key], world, byte_count, f"{key} must list {world:,} integers (bytes), one per "
                                                            "rank", problems)
    if any(v is None for v in values.values()) or len(values) < len(counts):
        return None
    return Movement(**values)


# ---------------------------------------------------------------- values


def _hash(value: object) -> str:
    if isinstance(value, str) and HASH.fullmatch(value):
        return value
    raise ValueError(f"expected 16 hexadecimal digits, got {show(value)}")


def _finite(value: object) -> int | float:
    finite_number(value)
    return number_value(value)


def _fraction(value: object) -> int | float:
    finite_number(value, minimum=0.0, maximum=1.0)
    return number_value(value)


def _bound_method(value: object) -> BoundMethod | Literal["unknown"]:
    if value == UNKNOWN_BOUND:
        return UNKNOWN_BOUND
    return choice(BoundMethod, value)


