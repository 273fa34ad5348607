"""Raw rows (dicts from any reader) -> a validated ``Spec``, or one InputError listing every problem.

Cells may be typed (YAML, JSON, Parquet) or text (CSV), so numbers and lists are also read from
strings. A missing cell, null or empty string means "use the default"; NaN is an error, not a default.
Besides each cell, a table must be one TorchRec can build and the cost model can count exactly
(``rec.spec.limits``).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from numbers import Integral
from typing import Any

from rec.config.cost import Optimizer
from rec.errors import InputError, Problem, ProblemList, show
from rec.sharding import NOT_PLANNED, ComputeKernel, DataType, ModuleKind, Pooling, ShardingType, offered
from rec.spec.columns import COLUMNS, CURVE_FIELDS, LIST_SEPARATOR, PAIR_SEPARATOR, REQUIRED
from rec.spec.hashing import spec_hash
from rec.spec.limits import (
    DIM_RULE,
    MAX_EMBEDDING_DIM,
    MAX_TABLE_WEIGHTS,
    MAX_TABLES,
    MODULE_PART_RULE,
    MODULE_RULE,
    NAME_RULE,
    RESERVED_RULE,
    is_module_attribute,
    is_module_path,
    is_reserved,
    is_table_name,
    spec_problems,
    table_problems,
    too_many_tables,
)
from rec.spec.types import DEFAULT_MODULE, Spec, TableSpec
from rec.units import format_count
from rec.validation import boolean, finite_number, integer, number_value, positive_integer, unknown_key

MAX_COUNT = 2**63 - 1  # the statistics' counts: Parquet and Arrow hold them as int64


def spec_from_rows(rows: Sequence[object], source: str = "") -> Spec:
    """Validate table rows (one mapping per table) into a ``Spec``; raise InputError with all problems.

    ``source`` (a path, a generator call) only labels the error message.
    """
    rows = list(rows)
    title = f"Invalid spec {source}".rstrip()
    if not rows:
        raise InputError(title, [Problem(source or "spec", "the spec has no tables")])
    if len(rows) > MAX_TABLES:
        raise InputError(title, [Problem(source or "spec", too_many_tables(len(rows)))])
    problems = ProblemList()
    absent = _check_columns(rows, problems)
    parsed: list[tuple[int, dict[str, Any]]] = []
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            problems.add(f"row {number}", f"expected a mapping of column to value, got {show(row)}")
            continue
        parsed.append((number, _parse_row(number, row, absent, problems)))
    # Rows with a bad value still take part, so a duplicate name is reported alongside it.
    _check_unique(parsed, problems)
    problems.items += module_problems([values for _, values in parsed])
    _check_sizes(parsed, problems)
    raise_problems(title, problems.items)
    tables = tuple(TableSpec(**values) for _, values in parsed)
    return Spec(tables=tables, spec_hash=spec_hash(tables))


def raise_problems(title: str, problems: list[Problem]) -> None:
    """Raise the spec's problems, if any, under ``title`` with their count."""
    if problems:
        raise InputError(f"{title}: {len(problems)} problem{'s' if len(problems) > 1 else ''}", problems)


def _check_columns(rows: Sequence[object], problems: ProblemList) -> set[str]:
    """Report unknown columns and required columns absent from every row; return the latter."""
    mappings = [r for r in rows if isinstance(r, Mapping)]
    seen: dict[str, list[int]] = {}
    for number, row in enumerate(rows, start=1):
        if isinstance(row, Mapping):
            for key in row:
                seen.setdefault(str(key), []).append(number)
    for key in sorted(set(seen) - set(COLUMNS)):
        numbers = seen[key]
        where = [_where(n, row) for n in numbers[:3] if isinstance(row := rows[n - 1], Mapping)]
        found = "" if len(numbers) == len(mappings) else f" in {_list_some(where, len(numbers))}"
        problems.add(f"column '{key}'", unknown_key(key, COLUMNS, "column", found))
    absent = {c for c in REQUIRED if c not in seen}
    for column in sorted(absent):
        problems.add(f"column '{column}'", "required column is missing")
    return absent


def _parse_row(number: int, row: Mapping[Any, Any], absent: set[str], problems: ProblemList) -> dict[str, Any]:
    """The row's valid values by column (TableSpec's keyword arguments when the row has no problem)."""
    where = _where(number, row)
    values: dict[str, Any] = {}
    for column, parse in CELL_PARSERS.items():
        raw = row.get(column)
        if is_missing(raw):
            if column in REQUIRED and column not in absent:
                problems.add(where, f"{column} is required")
            continue
        try:
            values[column] = parse(raw)
        except ValueError as e:
            problems.add(where, f"{column}: {e}")
    if "name" in values and is_missing(row.get("feature_names")):
        values["feature_names"] = (values["name"],)
    if "cache_load_factor" in values and "min_cache_load_factor" in values:
        problems.add(where, "cache_load_factor and min_cache_load_factor: give one (cache_load_factor fixes the "
                            "cache's size, min_cache_load_factor lets the planner grow it from there)")
    if "distinct_per_batch" in values and is_missing(row.get("stats_batch_size")):
        problems.add(where, "distinct_per_batch needs stats_batch_size, the batch size it was counted at")
    if "num_embeddings" in values and "embedding_dim" in values:
        for reason in table_problems(values["num_embeddings"], values["embedding_dim"],
                                     values.get("sharding_types"), values.get("compute_kernels")):
            problems.add(where, reason)
    return values


def _check_sizes(parsed: list[tuple[int, dict[str, Any]]], problems: ProblemList) -> None:
    """The whole spec's bounds (``rec.spec.limits``), over the tables whose sizes are valid."""
    weights, ids, widths = [], [], []
    for _, values in parsed:
        rows, dim = values.get("num_embeddings"), values.get("embedding_dim")
        if rows is None or dim is None or rows * dim > MAX_TABLE_WEIGHTS:  # too big: reported per table
            continue
        features = len(values.get("feature_names") or (None,))
        pooling_factor = values.get("pooling_factor", 1.0)
        weights.append(rows * dim)
        ids.append(pooling_factor * features)
        widths.append(dim * features * (pooling_factor if values.get("pooling") is Pooling.NONE else 1))
    problems.items += spec_problems(weights, ids, widths)


def _check_unique(parsed: list[tuple[int, dict[str, Any]]], problems: ProblemList) -> None:
    """Table names and feature names are unique within a module (as TorchRec's modules require);
    tables of different modules may share both (TorchRec addresses them by module path)."""
    first_row: dict[tuple[str, str], int] = {}
    feature_owner: dict[tuple[str, str], str] = {}
    for number, values in parsed:
        name = values.get("name")
        if name is None:
            continue
        module = values.get("module", DEFAULT_MODULE)
        where = _label(name, module)
        if (module, name) in first_row:
            problems.add(where, f"duplicate name (rows {first_row[module, name]} and {number})")
            continue
        first_row[module, name] = number
        for feature in values.get("feature_names", ()):
            owner = feature_owner.setdefault((module, feature), name)
            if owner != name:
                problems.add(where, f"feature '{feature}' is also used by table '{owner}'")


def module_problems(tables: Sequence[Mapping[str, Any]]) -> list[Problem]:
    """What TorchRec refuses in one module, given each table's parsed values (``TableSpec`` fields):
    pooling NONE (an EmbeddingCollection) beside SUM/MEAN (an EmbeddingBagCollection), weighted
    tables beside unweighted ones or in an EmbeddingCollection, an EmbeddingCollection's tables of
    different dims, allow-lists naming what the module's sharder never offers."""
    problems = []
    by_module: dict[str, list[Mapping[str, Any]]] = {}
    for values in tables:
        if "name" in values:
            by_module.setdefault(values.get("module", DEFAULT_MODULE), []).append(values)
    for inner in by_module:
        parts = inner.split(".")
        outer = next((o for i in range(1, len(parts)) if (o := ".".join(parts[:i])) in by_module), None)
        if outer is not None:
            problems.append(Problem(f"module '{inner}'", (
                f"lies inside module '{outer}': an embedding module holds tables, not other embedding modules "
                "(TorchRec shards the outer one and never looks inside)")))
    for module, members in by_module.items():
        poolings = [values.get("pooling", Pooling.SUM) for values in members]
        unpooled = list(dict.fromkeys(v["name"] for v, p in zip(members, poolings, strict=True) if p is Pooling.NONE))
        pooled = list(dict.fromkeys(v["name"] for v, p in zip(members, poolings, strict=True) if p is not Pooling.NONE))
        if unpooled and pooled:
            problems.append(Problem(f"module '{module}'", (
                f"mixes pooling NONE (an EmbeddingCollection: {_list_some(unpooled)}) with SUM/MEAN (an "
                f"EmbeddingBagCollection: {_list_some(pooled)}); a module is one or the other: give them "
                "different modules")))
        weighted = list(dict.fromkeys(v["name"] for v in members if v.get("is_weighted")))
        if weighted and unpooled:
            problems.append(Problem(f"module '{module}'", (
                f"has weighted tables ({_list_some(weighted)}) and pooling NONE: an EmbeddingCollection takes "
                "no per-id weights (TorchRec's is_weighted is an EmbeddingBagCollection's)")))
        elif weighted and len(weighted) < len(pooled):
            plain = [name for name in pooled if name not in weighted]
            problems.append(Problem(f"module '{module}'", (
                f"mixes weighted tables ({_list_some(weighted)}) with unweighted ones ({_list_some(plain)}); an "
                "EmbeddingBagCollection is weighted or not as a whole: give them different modules")))
        if unpooled and not pooled:
            dims = Counter(v["embedding_dim"] for v in members if "embedding_dim" in v)
            if len(dims) > 1:
                found = ", ".join(f"{dim} ({_list_some([v['name'] for v in members if v.get('embedding_dim') == dim])})"
                                  for dim in sorted(dims))
                problems.append(Problem(f"module '{module}'", (
                    "an EmbeddingCollection's tables must share one embedding_dim (TorchRec: 'All tables in a "
                    f"EmbeddingCollection are required to have same embedding dimension'); found {found}")))
        for values in members:
            problems += _sharder_problems(values, module)
    return problems


def _sharder_problems(values: Mapping[str, Any], module: str) -> list[Problem]:
    """Allow-listed sharding types and kernels the table's sharder never offers."""
    kind = values.get("pooling", Pooling.SUM).module_kind
    types, kernels = offered(kind)
    out = []
    lists: tuple[tuple[str, type[Enum], Any, frozenset[Any]], ...] = (
        ("sharding_types", ShardingType, values.get("sharding_types"), types),
        ("compute_kernels", ComputeKernel, values.get("compute_kernels"), kernels))
    for column, enum, listed, known in lists:
        refused = [m.value for m in listed or () if m not in known]
        if refused:
            offers = ", ".join(m.value for m in enum if m in known)
            out.append(Problem(_label(values["name"], module), (
                f"{column}: {_list_some(refused)} {'is' if len(refused) == 1 else 'are'} not offered by TorchRec's "
                f"{kind.sharder} ({_kind_reason(kind)}), which offers {offers}")))
    return out


def _kind_reason(kind: ModuleKind) -> str:
    return "pooling NONE: an EmbeddingCollection" if kind is ModuleKind.EMBEDDING_COLLECTION else "pooled tables"


def _label(name: str, module: str) -> str:
    """How a problem names a table: by name in the default module, with its module in any other."""
    return f"table '{name}'" if module == DEFAULT_MODULE else f"table '{name}' in module '{module}'"


def _where(number: int, row: Mapping[Any, Any]) -> str:
    """A row for a message: its table, with its module outside the default one (tables of several
    modules may share a name), else its number."""
    name, module = row.get("name"), row.get("module")
    if isinstance(name, str) and name.strip():
        name = name.strip()
        where = f"table '{name if len(name) <= 60 else name[:57] + '...'}'"
        if isinstance(module, str) and is_module_path(module.strip()) and module.strip() != DEFAULT_MODULE:
            where += f" in module '{module.strip()}'"
        return where
    return f"row {number}"


def is_missing(value: object) -> bool:
    """An absent cell: None, or text that is empty or blank (CSV)."""
    return value is None or (isinstance(value, str) and not value.strip())


# -- cell parsers: return the typed value or raise ValueError with the reason ----------------------


def _parse_name(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {show(value)}")
    name = value.strip()
    if not is_table_name(name):
        rule = RESERVED_RULE if is_reserved(name) else NAME_RULE
        raise ValueError(f"{show(name)} cannot be a table name: {rule}")
    return name


def _parse_module(value: object) -> str:
    if isinstance(value, Integral) and not isinstance(value, bool):  # YAML reads the path "0" as a number
        value = str(int(value))
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {show(value)}")
    path = value.strip()
    if not is_module_path(path):
        raise ValueError(f"{show(path)} is not a module path: {MODULE_RULE}")
    taken = next((part for part in path.split(".") if is_module_attribute(part)), None)
    if taken is not None:
        raise ValueError(f"{show(path)}: its part {taken!r} {MODULE_PART_RULE}")
    return path


def _parse_positive_int(value: object) -> int:
    return positive_integer(value, text=True)  # text too: CSV cells are text


def _parse_dim(value: object) -> int:
    dim = _parse_positive_int(value)
    if dim > MAX_EMBEDDING_DIM:
        raise ValueError(f"must be at most {MAX_EMBEDDING_DIM:,}, got {format_count(dim)}: {DIM_RULE}")
    return dim


def _parse_positive_float(value: object) -> float:
    number = float(number_value(value, "a positive number", text=True))
    if math.isnan(number):
        raise ValueError("got NaN (not a number); leave the cell empty to use the default 1.0")
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be a finite number > 0, got {show(value)}")
    return number


def _parse_count(value: object) -> int:
    return integer(value, "an integer >= 0", minimum=0, maximum=MAX_COUNT, text=True)


def _parse_stats_int(value: object) -> int:
    return positive_integer(value, maximum=MAX_COUNT, text=True)


def _parse_distinct(value: object) -> float:
    return finite_number(value, "a number >= 0", minimum=0.0, text=True)


def _parse_weighted(value: object) -> bool:
    """true or false; CSV's text ``true``/``false`` too."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return boolean(value)


def _parse_load_factor(value: object) -> float:
    """A cache's share of its table's rows: in (0, 1], as TorchRec's CacheParams.load_factor."""
    number = finite_number(value, "a number in (0, 1]", text=True)
    if not 0 < number <= 1:
        raise ValueError(f"must be in (0, 1] (the share of the table's rows its cache holds), got {number!r}")
    return number


def _parse_curve(value: object) -> tuple[tuple[float, float], ...]:
    """(cache_fraction, hit_rate) points: fractions in (0, 1] increasing, rates in [0, 1] not decreasing."""
    if isinstance(value, str):
        points: list[object] = [item.split(PAIR_SEPARATOR) for item in value.split(LIST_SEPARATOR) if item.strip()]
    elif isinstance(value, (list, tuple)):
        points = list(value)
    else:
        raise ValueError(f"expected a list of (cache_fraction, hit_rate) pairs (in CSV: "
                         f"'0.01{PAIR_SEPARATOR}0.4{LIST_SEPARATOR}0.1{PAIR_SEPARATOR}0.8'), got {show(value)}")
    if not points:
        raise ValueError("must not be empty (leave the cell empty when not measured)")
    curve = tuple(_curve_point(number, point) for number, point in enumerate(points, start=1))
    for number, ((f0, h0), (f1, h1)) in enumerate(itertools.pairwise(curve), start=2):
        if f1 <= f0:
            raise ValueError(f"point {number}: cache fractions must increase, got {f1!r} after {f0!r}")
        if h1 < h0:
            raise ValueError(f"point {number}: a larger cache cannot serve fewer lookups, hit rate {h1:g} "
                             f"after {h0:g}")
    return curve


def _curve_point(number: int, point: object) -> tuple[float, float]:
    if isinstance(point, Mapping) and set(point) == set(CURVE_FIELDS):
        pair: object = [point[key] for key in CURVE_FIELDS]
    else:
        pair = point
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise ValueError(f"point {number}: expected a pair (cache_fraction, hit_rate), got {show(point)}")
    try:
        fraction = finite_number(pair[0], "a number", text=True)
        rate = finite_number(pair[1], "a number", text=True)
    except ValueError as e:
        raise ValueError(f"point {number}: {e}") from None
    if not 0 < fraction <= 1:
        raise ValueError(f"point {number}: cache_fraction must be in (0, 1], got {fraction!r}")
    if not 0 <= rate <= 1:
        raise ValueError(f"point {number}: hit_rate must be in [0, 1], got {rate!r}")
    return fraction, rate


def _parse_names(value: object) -> tuple[str, ...]:
    names = _text_list(value)
    if len(set(names)) == len(names):
        return names
    duplicates = sorted(n for n, k in Counter(names).items() if k > 1)
    raise ValueError(f"lists {_list_some([repr(d) for d in duplicates])} more than once")


def _text_list(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [item.strip() for item in value.split(LIST_SEPARATOR)]
    elif isinstance(value, (list, tuple)):
        if not all(isinstance(item, str) for item in value):
            raise ValueError(f"expected a list of text, got {show(value)}")
        items = [item.strip() for item in value]
    else:
        raise ValueError(f"expected a list of text (in CSV: '{LIST_SEPARATOR}'-separated), got {show(value)}")
    bad = next((item for item in items if not item.isprintable()), None)
    if bad is not None:
        raise ValueError(f"{show(bad)} holds a control character (a tab, newline or escape)")
    items = [item for item in items if item]
    if not items:
        raise ValueError("must not be empty (leave the cell empty to use the default)")
    return tuple(items)


def _enum_parser(enum: type[Enum], noun: str) -> Callable[[object], Enum]:
    def parse(value: object) -> Enum:
        if not isinstance(value, str):
            raise ValueError(f"expected one of {_known(enum)}, got {show(value)}")
        return _member(enum, noun, value)

    return parse


def _enum_list_parser(enum: type[Enum], noun: str) -> Callable[[object], tuple[Enum, ...] | None]:
    def parse(value: object) -> tuple[Enum, ...] | None:
        items = _text_list(value)
        unknown = [item for item in items if _lookup(enum, item) is None and _refused(item) is None]
        refused = list(dict.fromkeys(r for item in items if (r := _refused(item)) is not None))
        if unknown or refused:
            named = _list_some([repr(u) for u in unknown], limit=10)
            plural = "s" if len(unknown) > 1 else ""
            reasons = [f"unknown {noun}{plural} {named} (known: {_known(enum)})"] if unknown else []
            raise ValueError("; ".join(reasons + refused))
        chosen = {_lookup(enum, item) for item in items}
        listed = tuple(m for m in enum if m in chosen)  # declaration order, so the hash ignores list order
        # Every value listed is no constraint: the default, and its hash.
        return None if listed == tuple(m for m in enum if m not in NOT_PLANNED) else listed

    return parse


def _member(enum: type[Enum], noun: str, text: str) -> Enum:
    refused = _refused(text)
    if refused is not None:
        raise ValueError(refused)
    member = _lookup(enum, text)
    if member is None:
        raise ValueError(f"unknown {noun} {text!r} (known: {_known(enum)})")
    return member


def _refused(text: str) -> str | None:
    """Why shardflow refuses a TorchRec name it never plans (``rec.sharding.NOT_PLANNED``), or None."""
    return _NOT_PLANNED.get(text.strip().lower())


def _lookup(enum: type[Enum], text: str) -> Enum | None:
    return _spellings(enum).get(text.strip().lower())


@functools.cache
def _spellings(enum: type[Enum]) -> dict[str, Enum]:
    """Lower-case value and name of every member (values win where the two collide)."""
    out = {m.name.lower(): m for m in reversed(list(enum))}
    out.update({m.value.lower(): m for m in reversed(list(enum))})
    return out


def _known(enum: type[Enum]) -> str:
    """The values a spec may use: every member but those shardflow refuses."""
    return ", ".join(m.value for m in enum if m not in NOT_PLANNED)




def _list_some(items: list[str], total: int | None = None, limit: int = 3) -> str:
    """The first ``limit`` of ``items`` and how many more there are (of ``total``, if more than given)."""
    total = len(items) if total is None else total
    shown = ", ".join(items[:limit])
    return shown if total <= limit else f"{shown} and {total - limit} more"


# TorchRec names shardflow never plans, by spelling: refused with the reason, before the enum lookup.
_NOT_PLANNED = {member.value: reason for member, reason in NOT_PLANNED.items()}

CELL_PARSERS = {
    "name": _parse_name,
    "num_embeddings": _parse_positive_int,
    "embedding_dim": _parse_dim,
    "feature_names": _parse_names,
    "pooling": _enum_parser(Pooling, "pooling"),
    "data_type": _enum_parser(DataType, "data type"),
    "pooling_factor": _parse_positive_float,
    "sharding_types": _enum_list_parser(ShardingType, "sharding type"),
    "compute_kernels": _enum_list_parser(ComputeKernel, "compute kernel"),
    "module": _parse_module,
    "min_partition": _parse_positive_int,
    "cache_load_factor": _parse_load_factor,
    "min_cache_load_factor": _parse_load_factor,
    "optimizer": _enum_parser(Optimizer, "optimizer"),
    "is_weighted": _parse_weighted,
    "stats_rows": _parse_stats_int,
    "stats_batch_size": _parse_stats_int,
    "distinct_per_batch": _parse_distinct,
    "ids_out_of_range": _parse_count,
    "hit_rate_curve": _parse_curve,
}
