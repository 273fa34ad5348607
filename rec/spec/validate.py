"""Raw rows (dicts from any reader) -> a validated ``Spec``, or one InputError listing every problem.

Cells may be typed (YAML, JSON, Parquet) or text (CSV), so numbers and lists are also read from
strings. A missing cell, null or empty string means "use the default"; NaN is an error, not a default.
Besides each cell, a table must be one TorchRec can build and the cost model can count exactly
(``rec.spec.limits``).
"""

from __future__ import annotations

import difflib
import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from numbers import Integral, Real
from typing import Any

from rec.errors import InputError, Problem, ProblemList, show
from rec.sharding import NOT_PLANNED, ComputeKernel, DataType, Pooling, ShardingType
from rec.spec.columns import COLUMNS, LIST_SEPARATOR, REQUIRED
from rec.spec.hashing import spec_hash
from rec.spec.limits import (
    DIM_RULE,
    MAX_EMBEDDING_DIM,
    MAX_TABLE_WEIGHTS,
    MAX_TABLES,
    NAME_RULE,
    RESERVED_RULE,
    is_reserved,
    is_table_name,
    spec_problems,
    table_problems,
    too_many_tables,
)
from rec.spec.types import Spec, TableSpec
from rec.units import format_count


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
        hint = difflib.get_close_matches(key, COLUMNS, n=1) if len(key) <= 64 else []
        numbers = seen[key]
        where = [_where(n, row) for n in numbers[:3] if isinstance(row := rows[n - 1], Mapping)]
        found = "" if len(numbers) == len(mappings) else f" in {_list_some(where, len(numbers))}"
        suggestion = f"did you mean '{hint[0]}'? " if hint else ""
        problems.add(f"column '{key}'", f"unknown column{found}; {suggestion}known columns: {', '.join(COLUMNS)}")
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
        weights.append(rows * dim)
        ids.append(values.get("pooling_factor", 1.0) * features)
        widths.append(dim * features)
    problems.items += spec_problems(weights, ids, widths)


def _check_unique(parsed: list[tuple[int, dict[str, Any]]], problems: ProblemList) -> None:
    first_row: dict[str, int] = {}
    feature_owner: dict[str, str] = {}
    for number, values in parsed:
        name = values.get("name")
        if name is None:
            continue
        if name in first_row:
            problems.add(f"table '{name}'", f"duplicate name (rows {first_row[name]} and {number})")
            continue
        first_row[name] = number
        for feature in values.get("feature_names", ()):
            owner = feature_owner.setdefault(feature, name)
            if owner != name:
                problems.add(f"table '{name}'", f"feature '{feature}' is also used by table '{owner}'")


def _where(number: int, row: Mapping[Any, Any]) -> str:
    name = row.get("name")
    if isinstance(name, str) and name.strip():
        name = name.strip()
        return f"table '{name if len(name) <= 60 else name[:57] + '...'}'"
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


def _parse_positive_int(value: object) -> int:
    number = _number(value, "a positive integer")
    if isinstance(number, float):
        if math.isnan(number):
            raise ValueError("expected a positive integer, got NaN (not a number)")
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"expected a positive integer, got {show(value)}")
        number = int(number)
    if number <= 0:
        raise ValueError(f"must be > 0, got {format_count(number)}")
    return number


def _parse_dim(value: object) -> int:
    dim = _parse_positive_int(value)
    if dim > MAX_EMBEDDING_DIM:
        raise ValueError(f"must be at most {MAX_EMBEDDING_DIM:,}, got {format_count(dim)}: {DIM_RULE}")
    return dim


def _parse_positive_float(value: object) -> float:
    number = float(_number(value, "a positive number"))
    if math.isnan(number):
        raise ValueError("got NaN (not a number); leave the cell empty to use the default 1.0")
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be a finite number > 0, got {show(value)}")
    return number


def _number(value: object, expected: str) -> int | float:
    if type(value) is int or type(value) is float:  # the common case, before the slower checks below
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected {expected}, got {show(value)}")
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        try:
            return float(value)
        except OverflowError:  # e.g. a Fraction beyond float
            return math.inf
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        for convert in (int, float):
            try:
                return convert(text)
            except ValueError:
                pass
    raise ValueError(f"expected {expected}, got {show(value)}")


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
        bad = next((item for item in items if not item.isprintable()), None)
        if bad is not None:
            raise ValueError(f"{show(bad)} holds a control character (a tab, newline or escape)")
    else:
        raise ValueError(f"expected a list of text (in CSV: '{LIST_SEPARATOR}'-separated), got {show(value)}")
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


def _enum_list_parser(enum: type[Enum], noun: str) -> Callable[[object], tuple[Enum, ...]]:
    def parse(value: object) -> tuple[Enum, ...]:
        chosen = {_member(enum, noun, item) for item in _text_list(value)}
        return tuple(m for m in enum if m in chosen)  # declaration order, so the hash ignores list order

    return parse


def _member(enum: type[Enum], noun: str, text: str) -> Enum:
    refused = _NOT_PLANNED.get(text.strip().lower())
    if refused is not None:
        raise ValueError(refused)
    member = _spellings(enum).get(text.strip().lower())
    if member is None:
        raise ValueError(f"unknown {noun} {text!r} (known: {_known(enum)})")
    return member


@functools.cache
def _spellings(enum: type[Enum]) -> dict[str, Enum]:
    """Lower-case value and name of every member (values win where the two collide)."""
    out = {m.name.lower(): m for m in reversed(list(enum))}
    out.update({m.value.lower(): m for m in reversed(list(enum))})
    return out


def _known(enum: type[Enum]) -> str:
    return ", ".join(m.value for m in enum)




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
}
