"""One grammar for what shardflow reads: the rules every file's keys and values are checked with.

Specs, topologies, profiles and plans read back use these rules, so a number, a size or a name
means the same in each (docs/spec.md, docs/topology.md, docs/profile.md):

- **numbers**: a YAML or JSON number, exponents included (``1e3``, ``2.5e-3``, ``1000.0``); a
  boolean is not a number; NaN and infinities are refused wherever a finite number is needed. Only
  where a format has no types (a spec's cells: CSV) is text read as a number, and then only text
  written as a number is: ``"1e3"``, never ``"1_000"`` or ``"0x10"``.
- **integers**: such a number with an integral value: ``1000``, ``1e3`` and ``1000.0`` alike.
- **sizes**: bytes as an integer or text with a unit (``80GiB``, ``512 GB``, ``1.5TiB``, ``1e9``);
  bandwidths the same per second (``600GB/s``).
- **names**: text without control characters (a tab, a newline, a terminal escape).
- **keys**: only known ones; an unknown key is named with the closest known one.

A rule returns the value as its type or raises ValueError saying why; ``Problems.take`` records
that reason under the key and goes on, so every problem of a file is named, not only the first.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from numbers import Integral, Real
from typing import Any, TypeVar

from rec.errors import Problem, ProblemList, show
from rec.units import format_count, parse_bytes, parse_bytes_per_second

T = TypeVar("T")
E = TypeVar("E", bound=Enum)

# A number written as text: digits with an optional point and exponent (ASCII digits only: Python's
# int() and float() would also read other scripts' digits, '_' separators, 'inf' and 'nan').
NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_NAN_TEXT = frozenset({"nan", "+nan", "-nan"})
MAX_SUGGESTED_KEY = 64  # longer unknown keys get no suggestion: difflib's work grows with their length


class Problems(ProblemList):
    """Collects every problem of one input; ``within`` names the keys of a nested mapping."""

    def __init__(self, root: str = "", prefix: str = "", items: list[Problem] | None = None) -> None:
        super().__init__()
        if items is not None:
            self.items = items  # shared with the collector this one was made ``within``
        self.root = root  # names the input itself (e.g. "topology"), for problems of the whole
        self.prefix = prefix

    def within(self, key: str) -> Problems:
        """A collector for the mapping at ``key``: its problems are named ``key.inner`` and kept here."""
        return Problems(self.root, f"{self.prefix}{key}.", self.items)

    def name(self, key: str = "") -> str:
        """How a problem at ``key`` is named (the mapping itself for the empty key)."""
        return f"{self.prefix}{key}" if key else (self.prefix.rstrip(".") or self.root)

    def add(self, where: str, reason: str) -> None:
        self.items.append(Problem(self.name(where), reason))

    def take(self, key: str, rule: Callable[[object], T], value: object) -> T | None:
        """``rule(value)``, or None with its reason recorded at ``key``."""
        try:
            return rule(value)
        except ValueError as e:
            self.add(key, str(e))
            return None

    def take_from(self, d: Mapping[str, Any], key: str, rule: Callable[[object], T]) -> T | None:
        """``rule(d[key])``, or None with its reason recorded; None when ``key`` is absent or null
        (``required`` names the keys that must be there)."""
        return None if d.get(key) is None else self.take(key, rule, d[key])


# ---------------------------------------------------------------- numbers


def number_value(value: object, expected: str = "a number", *, text: bool = False) -> int | float:
    """The number ``value`` holds (NaN and infinities included; the caller decides); ValueError
    naming ``expected`` otherwise. ``text``: text written as a number counts too (CSV cells)."""
    if type(value) is int or type(value) is float:  # the common case, before the slower checks
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
    if text and isinstance(value, str):
        written = value.strip()
        if INTEGER_TEXT.fullmatch(written):
            try:
                return int(written)
            except ValueError:  # more digits than Python converts: as large as a float can say
                return math.inf
        if NUMBER_TEXT.fullmatch(written):
            return float(written)
        if written.lower() in _NAN_TEXT:
            return math.nan
    raise ValueError(f"expected {expected}, got {show(value)}")


def integer(value: object, expected: str = "an integer", *, minimum: int | None = None,
            maximum: int | None = None, text: bool = False) -> int:
    """An integral number (``1000``, ``1e3``, ``1000.0``) within the bounds (inclusive)."""
    if type(value) is int and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return value  # the common case
    number = number_value(value, expected, text=text)
    if isinstance(number, float):
        if math.isnan(number):
            raise ValueError(f"expected {expected}, got NaN (not a number)")
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"expected {expected}, got {show(value)}")
        number = int(number)
    if minimum is not None and number < minimum:
        bound = "> 0" if minimum == 1 else f">= {format_count(minimum)}"
        raise ValueError(f"must be {bound}, got {format_count(number)}")
    if maximum is not None and number > maximum:
        raise ValueError(f"must be at most {format_count(maximum)}, got {format_count(number)}")
    return number


def positive_integer(value: object, *, maximum: int | None = None, text: bool = False) -> int:
    """An integer > 0."""
    return integer(value, "a positive integer", minimum=1, maximum=maximum, text=text)


def finite_number(value: object, expected: str = "a number", *, minimum: float | None = None,
                  maximum: float | None = None, text: bool = False) -> float:
    """A finite number within the bounds (inclusive), as a float."""
    number = float(number_value(value, expected, text=text))
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {show(value)}")
    low = -math.inf if minimum is None else minimum
    high = math.inf if maximum is None else maximum
    if not low <= number <= high:
        if minimum is not None and maximum is not None:
            raise ValueError(f"must be between {minimum:g} and {maximum:g}, got {show(value)}")
        bound = f">= {minimum:g}" if minimum is not None else f"<= {maximum:g}"
        raise ValueError(f"must be {bound}, got {show(value)}")
    return number


# ---------------------------------------------------------------- sizes


def byte_size(value: object, *, minimum: int = 0, maximum: int | None = None,
              describe: Callable[[int], str] = format_count) -> int:
    """Bytes: an integer (``1e9`` too) or text with a unit (``80GiB``, ``512 GB``, ``1.5TiB``)."""
    size = parse_bytes(value)
    if size < minimum:
        raise ValueError(f"must be {'> 0' if minimum == 1 else f'>= {minimum}'} bytes, got {show(value)}")
    if maximum is not None and size > maximum:
        raise ValueError(f"must be at most {describe(maximum)}, got {show(value)}")
    return size


def bandwidth(value: object, *, minimum: float, maximum: float) -> float:
    """Bytes/s: a number or text with a unit, with or without ``/s`` (``600GB/s``, ``12.5e9``)."""
    per_second = parse_bytes_per_second(value)
    if not per_second > 0:
        raise ValueError(f"must be > 0 bytes/s, got {show(value)}")
    if not minimum <= per_second <= maximum:
        raise ValueError(f"must be between {minimum:g} and {maximum:g} bytes/s, got {show(value)}")
    return per_second


# ---------------------------------------------------------------- names and choices


def name(value: object, *, max_length: int, hint: str = "") -> str:
    """Text, blanks at either end removed, not empty, without control characters, at most ``max_length``
    characters. ``hint`` follows the reason when ``value`` is a number (e.g. "write it in quotes")."""
    if not isinstance(value, str) or not value.strip():
        numeric = isinstance(value, Real) and not isinstance(value, bool)
        raise ValueError(f"expected text, got {show(value)}{hint if numeric else ''}")
    if len(value) > max_length:
        raise ValueError(f"at most {max_length:,} characters, got {len(value):,}")
    text = value.strip()
    if not text.isprintable():
        raise ValueError(f"{show(text)} holds a control character (a tab, newline or escape)")
    return text


def choice(enum: type[E], value: object) -> E:
    """The member of ``enum`` whose value ``value`` is (blanks and case aside)."""
    if isinstance(value, str):
        written = value.strip().lower()
        for member in enum:
            if str(member.value).lower() == written:
                return member
    raise ValueError(f"expected one of {', '.join(str(m.value) for m in enum)}, got {show(value)}")


def one_of_values(values: Iterable[str]) -> Callable[[object], str]:
    """A rule taking exactly one of ``values`` (text as written)."""
    known = tuple(values)

    def rule(value: object) -> str:
        if isinstance(value, str) and value in known:
            return value
        raise ValueError(f"expected one of {', '.join(known)}, got {show(value)}")

    return rule


def boolean(value: object) -> bool:
    """true or false (a YAML or JSON boolean, not a number or text)."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"expected true or false, got {show(value)}")


def text_list(value: object) -> tuple[str, ...]:
    """A list of text (each without control characters)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a list of text, got {show(value)}")
    bad = next((v for v in value if not v.isprintable()), None)
    if bad is not None:
        raise ValueError(f"{show(bad)} holds a control character (a tab, newline or escape)")
    return tuple(value)


# ---------------------------------------------------------------- mappings and keys


def validated(read: Callable[[object, Problems], T | None], value: object, source: str, what: str) -> T:
    """``read``'s value of ``value``, or InputError titled ``Invalid WHAT SOURCE`` naming every
    problem it recorded: a file's validator, from the reader a plan reader shares."""
    problems = Problems(root=source)
    out = read(value, problems)
    problems.raise_if_any(f"Invalid {what} {source}")
    assert out is not None  # no problem recorded: the reader made its value
    return out


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the known key closest to ``key``, or nothing."""
    hint = difflib.get_close_matches(key, list(known), n=1) if len(key) <= MAX_SUGGESTED_KEY else []
    return f"did you mean '{hint[0]}'? " if hint else ""


def unknown_key(key: str, known: Iterable[str], noun: str = "key", found: str = "") -> str:
    """Why ``key`` is refused: unknown (``found``: where), the closest known one, and every known one."""
    known = tuple(known)
    return f"unknown {noun}{found}; {did_you_mean(key, known)}known {noun}s: {', '.join(known)}"


def mapping(value: object, problems: Problems, key: str, expected: str = "a mapping") -> Mapping[Any, Any] | None:
    """``value`` if it is a mapping; None (and a problem at ``key`` unless it is None) otherwise."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        problems.add(key, f"expected {expected}, got {show(value)}")
        return None
    return value


def known_keys(d: Mapping[Any, Any], keys: Iterable[str], problems: Problems) -> dict[str, Any]:
    """The known keys of ``d`` and their values; a problem for keys that are not text, and one per
    unknown key (with the closest known one)."""
    keys = tuple(keys)
    odd = [show(k) for k in d if not isinstance(k, str)]
    if odd:
        problems.add("", f"keys must be text, got {', '.join(sorted(odd))}")
    for key in sorted(k for k in d if isinstance(k, str) and k not in keys):
        problems.add(key, unknown_key(key, keys))
    return {k: v for k, v in d.items() if isinstance(k, str) and k in keys}


def required(d: Mapping[str, Any], keys: Iterable[str], problems: Problems) -> None:
    """A problem for each of ``keys`` absent (or null) in ``d``."""
    for key in keys:
        if d.get(key) is None:
            problems.add(key, "is required")
