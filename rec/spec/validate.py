"""Raw rows (dicts from any reader) -> a validated ``Spec``, or one InputError listing every problem.

Cells may be typed (YAML, JSON, Parquet) or text (CSV), so numbers and lists are also read from
strings. A missing cell, null, NaN or empty string means "use the default".
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Mapping, Sequence
from enum import Enum
from numbers import Integral, Real

from rec.errors import InputError, Problem, ProblemList
from rec.sharding import ComputeKernel, DataType, Pooling, ShardingType
from rec.spec.columns import COLUMNS, LIST_SEPARATOR, REQUIRED
from rec.spec.hashing import spec_hash
from rec.spec.types import Spec, TableSpec


def spec_from_rows(rows: Sequence[Mapping], source: str = "") -> Spec:
    """Validate table rows (one mapping per table) into a ``Spec``; raise InputError with all problems.

    ``source`` (a path, a generator call) only labels the error message.
    """
    rows = list(rows)
    title = f"Invalid spec {source}".rstrip()
    if not rows:
        raise InputError(title, [Problem(source or "spec", "the spec has no tables")])
    problems = ProblemList()
    absent = _check_columns(rows, problems)
    parsed: list[tuple[int, dict]] = []
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            problems.add(f"row {number}", f"expected a mapping of column to value, got {_show(row)}")
            continue
        parsed.append((number, _parse_row(number, row, absent, problems)))
    # Rows with a bad value still take part, so a duplicate name is reported alongside it.
    _check_unique(parsed, problems)
    count = len(problems.items)
    problems.raise_if_any(f"{title}: {count} problem{'s' if count > 1 else ''}")
    tables = tuple(TableSpec(**values) for _, values in parsed)
    return Spec(tables=tables, spec_hash=spec_hash(tables))


def _check_columns(rows: Sequence[Mapping], problems: ProblemList) -> set[str]:
    """Report unknown columns and required columns absent from every row; return the latter."""
    mappings = [r for r in rows if isinstance(r, Mapping)]
    seen: dict[str, list[int]] = {}
    for number, row in enumerate(rows, start=1):
        if isinstance(row, Mapping):
            for key in row:
                seen.setdefault(str(key), []).append(number)
    for key in sorted(set(seen) - set(COLUMNS)):
        hint = difflib.get_close_matches(key, COLUMNS, n=1)
        where = [_where(number, rows[number - 1]) for number in seen[key]]
        found = "" if len(where) == len(mappings) else f" in {_list_some(where)}"
        suggestion = f"did you mean '{hint[0]}'? " if hint else ""
        problems.add(f"column '{key}'", f"unknown column{found}; {suggestion}known columns: {', '.join(COLUMNS)}")
    absent = {c for c in REQUIRED if c not in seen}
    for column in sorted(absent):
        problems.add(f"column '{column}'", "required column is missing")
    return absent


def _parse_row(number: int, row: Mapping, absent: set[str], problems: ProblemList) -> dict:
    """The row's valid values by column (TableSpec's keyword arguments when the row has no problem)."""
    where = _where(number, row)
    values: dict[str, object] = {}
    for column, parse in _PARSERS.items():
        raw = row.get(column)
        if _is_missing(raw):
            if column in REQUIRED and column not in absent:
                problems.add(where, f"{column} is required")
            continue
        try:
            values[column] = parse(raw)
        except ValueError as e:
            problems.add(where, f"{column}: {e}")
    if "name" in values and _is_missing(row.get("feature_names")):
        values["feature_names"] = (values["name"],)
    return values


def _check_unique(parsed: list[tuple[int, dict]], problems: ProblemList) -> None:
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


def _where(number: int, row: Mapping) -> str:
    name = row.get("name")
    if isinstance(name, str) and name.strip():
        return f"table '{name.strip()}'"
    return f"row {number}"


def _is_missing(value: object) -> bool:
    if value is None:
        return True
    if type(value) is int:
        return False
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


# -- cell parsers: return the typed value or raise ValueError with the reason ----------------------


def _parse_name(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {_show(value)}")
    return value.strip()


def _parse_positive_int(value: object) -> int:
    number = _number(value, "a positive integer")
    if isinstance(number, float):
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"expected a positive integer, got {_show(value)}")
        number = int(number)
    if number <= 0:
        raise ValueError(f"must be > 0, got {number}")
    return number


def _parse_positive_float(value: object) -> float:
    number = float(_number(value, "a positive number"))
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be a finite number > 0, got {_show(value)}")
    return number


def _number(value: object, expected: str) -> int | float:
    if type(value) in (int, float):  # the common case, before the slower checks below
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected {expected}, got {_show(value)}")
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        return float(value)
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        for convert in (int, float):
            try:
                return convert(text)
            except ValueError:
                pass
    raise ValueError(f"expected {expected}, got {_show(value)}")


def _parse_names(value: object) -> tuple[str, ...]:
    names = _text_list(value)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"lists {', '.join(repr(d) for d in duplicates)} more than once")
    return names


def _text_list(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [item.strip() for item in value.split(LIST_SEPARATOR)]
    elif isinstance(value, (list, tuple)):
        if not all(isinstance(item, str) for item in value):
            raise ValueError(f"expected a list of text, got {_show(value)}")
        items = [item.strip() for item in value]
    else:
        raise ValueError(f"expected a list of text (in CSV: '{LIST_SEPARATOR}'-separated), got {_show(value)}")
    items = [item for item in items if item]
    if not items:
        raise ValueError("must not be empty (leave the cell empty to use the default)")
    return tuple(items)


def _enum_parser(enum: type[Enum], noun: str):
    def parse(value: object) -> Enum:
        if not isinstance(value, str):
            raise ValueError(f"expected one of {_known(enum)}, got {_show(value)}")
        return _member(enum, noun, value)

    return parse


def _enum_list_parser(enum: type[Enum], noun: str):
    def parse(value: object) -> tuple[Enum, ...]:
        chosen = {_member(enum, noun, item) for item in _text_list(value)}
        return tuple(m for m in enum if m in chosen)  # declaration order, so the hash ignores list order

    return parse


def _member(enum: type[Enum], noun: str, text: str) -> Enum:
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


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _list_some(items: list[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"


_PARSERS = {
    "name": _parse_name,
    "num_embeddings": _parse_positive_int,
    "embedding_dim": _parse_positive_int,
    "feature_names": _parse_names,
    "pooling": _enum_parser(Pooling, "pooling"),
    "data_type": _enum_parser(DataType, "data type"),
    "pooling_factor": _parse_positive_float,
    "sharding_types": _enum_list_parser(ShardingType, "sharding type"),
    "compute_kernels": _enum_list_parser(ComputeKernel, "compute kernel"),
}
