"""Settings dataclasses as command-line flags and as plain JSON: each default is written once.

A step's settings are a frozen dataclass whose fields carry their help text and bounds in
``field(metadata=knob(...))``. ``add_flags`` derives argparse flags from it (nested settings are
flattened), ``from_flags`` builds the instance back, ``to_flags`` gives the flags of an instance
(for a subprocess), ``to_dict``/``from_dict`` give plain JSON values, and ``check`` turns values out
of bounds into one InputError; a field marked ``knob(path=True)`` names a file or directory, which
``resolve_paths`` finds (deployments resolve relative paths with it). The CLI, the Prefect flows
(which take settings whole, as parameters) and the training job all read the same dataclass, so no
default is copied.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar, Union, get_args, get_origin

from rec.errors import InputError, Problem

T = TypeVar("T")
MAX_TIME_LIMIT_S = 24 * 3600.0  # any time limit a knob takes: a day


def knob(help: str, *, flag: str | None = None, minimum: float | None = None,
         maximum: float | None = None, metavar: str | None = None, cli: bool = True,
         path: bool = False, above: float | None = None) -> dict[str, Any]:
    """Field metadata: the help text, the flag name (default: the field name with dashes), bounds
    (inclusive) checked by ``check``, the value's name in --help, ``cli=False`` for fields
    that get no flag, ``path=True`` for a file or directory (``resolve_paths``), and ``above``: an
    exclusive lower bound (a time limit of 0 s that could only time nothing)."""
    return {"help": help, "flag": flag, "minimum": minimum, "maximum": maximum,
            "metavar": metavar, "cli": cli, "path": path, "above": above}


def is_path(f: dataclasses.Field[Any]) -> bool:
    """Whether field ``f`` names a file or directory (``knob(path=True)``)."""
    return bool(f.metadata.get("path"))


def _fields(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f, hints[f.name]


def _optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True)."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def flag_name(f: dataclasses.Field[Any], rename: Mapping[str, str] | None = None) -> str:
    """The flag of field ``f`` without dashes, e.g. ``checkpoint-every``."""
    if rename and f.name in rename:
        return rename[f.name]
    return f.metadata.get("flag") or f.name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
              rename: Mapping[str, str] | None = None, skip: tuple[str, ...] = (),
              aliases: Mapping[str, tuple[str, ...]] | None = None) -> None:
    """One flag per field of ``cls`` (nested dataclasses flattened); help shows the default.

    ``rename``: field -> flag name; ``aliases``: field -> extra flag names; ``skip``: fields left out."""
    for f, tp in _fields(cls):
        if f.name in skip or not f.metadata.get("cli", True):
            continue
        tp, _ = _optional(tp)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            add_flags(parser, tp, rename, skip, aliases)
            continue
        default = _default(f)
        names = [f"--{flag_name(f, rename)}", *(f"--{a}" for a in (aliases or {}).get(f.name, ()))]
        help_text = f.metadata.get("help", "")
        # "none: ..." in the help already says what no value means.
        shown = "" if default is None and "none:" in help_text else f" (default: {_show(default)})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": default}
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif isinstance(tp, type) and issubclass(tp, Enum):
            kwargs["choices"] = [m.value for m in tp]
            kwargs["type"] = str
            kwargs["default"] = default.value if isinstance(default, Enum) else default
        elif get_origin(tp) is typing.Literal:
            kwargs["choices"] = list(get_args(tp))
        elif get_origin(tp) is tuple:
            kwargs["nargs"] = "+"
            kwargs["type"] = get_args(tp)[0]
            kwargs["metavar"] = "N"
        else:
            kwargs["type"] = tp
        if "type" in kwargs and kwargs["type"] in (int, float) and "metavar" not in kwargs:
            kwargs["metavar"] = "N" if kwargs["type"] is int else "X"
        if f.metadata.get("metavar"):
            kwargs["metavar"] = f.metadata["metavar"]
        # argparse formats help with %: a literal % (``within 2%``) must be doubled.
        parser.add_argument(*names, help=f"{help_text}{shown}".strip().replace("%", "%%"), **kwargs)


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def from_flags(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """An instance of ``cls`` from parsed flags (fields without a flag keep their default)."""
    values: dict[str, Any] = {}
    for f, tp in _fields(cls):
        if f.name in overrides:
            values[f.name] = overrides[f.name]
            continue
        if not f.metadata.get("cli", True):
            continue  # no flag (add_flags skipped it): the default
        inner, _ = _optional(tp)
        if dataclasses.is_dataclass(inner):
            values[f.name] = from_flags(inner, args)  # type: ignore[arg-type]
        elif hasattr(args, f.name):
            values[f.name] = _coerce(inner, getattr(args, f.name))
    return cls(**values)


def _coerce(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(value)
    if get_origin(tp) is tuple:
        return tuple(value)
    return value


def setting_at(cls: type, names: Sequence[str]) -> dataclasses.Field[Any] | None:
    """The field that ``names`` lead to through nested settings (``("job", "data")`` of
    ``TrainSettings``), or None where there is no such field."""
    found: dataclasses.Field[Any] | None = None
    current: Any = cls
    for name in names:
        if not (isinstance(current, type) and dataclasses.is_dataclass(current)):
            return None
        found, tp = next(((f, tp) for f, tp in _fields(current) if f.name == name), (None, None))
        if found is None:
            return None
        current, _ = _optional(tp)
    return found


def resolve_paths(cls: type, data: Mapping[str, Any], resolve: Callable[[str], str]) -> dict[str, Any]:
    """``data`` (plain values of some of ``cls``'s fields, as ``to_dict`` gives them) with
    ``resolve`` applied to the text of every path field (``knob(path=True)``), nested settings
    included; anything else is kept as it is."""
    out = dict(data)
    for f, tp in _fields(cls):
        value = data.get(f.name)
        inner, _ = _optional(tp)
        if isinstance(value, str) and value and is_path(f):
            out[f.name] = resolve(value)
        elif isinstance(value, Mapping) and isinstance(inner, type) and dataclasses.is_dataclass(inner):
            out[f.name] = resolve_paths(inner, value, resolve)
    return out


def to_dict(settings: Any) -> dict[str, Any]:
    """Plain JSON values: enums by value, tuples as lists, nested settings as dicts."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        out[f.name] = _plain(getattr(settings, f.name))
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def from_dict(cls: type[T], data: Mapping[str, Any], source: str = "settings") -> T:
    """``cls`` from ``to_dict``'s output; unknown keys or wrong types are an InputError."""
    if not isinstance(data, Mapping):
        raise InputError(f"Invalid {source}:", [Problem(source, "expected a mapping")])
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    problems = [Problem(f"{source}.{k}", "unknown setting") for k in data if k not in known]
    values: dict[str, Any] = {}
    for f, tp in _fields(cls):
        if f.name not in data:
            continue
        inner, optional = _optional(tp)
        raw = data[f.name]
        try:
            if raw is None and optional:
                values[f.name] = None
            elif dataclasses.is_dataclass(inner):
                values[f.name] = from_dict(inner, raw, f"{source}.{f.name}")  # type: ignore[arg-type]
            else:
                values[f.name] = _typed(inner, raw)
        except (TypeError, ValueError) as e:
            problems.append(Problem(f"{source}.{f.name}", str(e)))
    if problems:
        raise InputError(f"Invalid {source}:", problems)
    return cls(**values)


def _typed(tp: Any, raw: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(raw)
    if get_origin(tp) is tuple:
        if not isinstance(raw, (list, tuple)):
            raise TypeError(f"expected a list, got {raw!r}")
        return tuple(_typed(get_args(tp)[0], v) for v in raw)
    if get_origin(tp) is typing.Literal:
        if raw not in get_args(tp):
            raise ValueError(f"expected one of {', '.join(map(str, get_args(tp)))}, got {raw!r}")
        return raw
    if tp is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if tp in (int, float, str, bool) and (type(raw) is not tp):
        raise TypeError(f"expected {tp.__name__}, got {raw!r}")
    return raw


def to_flags(settings: Any, rename: Mapping[str, str] | None = None) -> list[str]:
    """The flags that reproduce ``settings`` with ``add_flags``' parser (defaults left out)."""
    out: list[str] = []
    for f, tp in _fields(type(settings)):
        value = getattr(settings, f.name)
        if not f.metadata.get("cli", True):
            continue  # no flag to give it
        inner, _ = _optional(tp)
        if dataclasses.is_dataclass(inner) and value is not None:
            out += to_flags(value, rename)
            continue
        if value == _default(f):
            continue
        name = f"--{flag_name(f, rename)}"
        if inner is bool:
            out.append(name if value else f"--no-{flag_name(f, rename)}")
        elif value is None:
            raise ValueError(f"{f.name}: None differs from the default and has no flag")
        elif isinstance(value, tuple):
            out += [name, *map(str, value)]
        else:  # NAME=VALUE: a value starting with "-" (a path such as -ck) is not read as a flag
            out.append(f"{name}={value.value if isinstance(value, Enum) else value}")
    return out


def check(settings: Any, title: str, where: Mapping[str, str] | None = None) -> None:
    """InputError (``settings_problems``) when the settings have any problem."""
    problems = settings_problems(settings, where)
    if problems:
        raise InputError(title, problems)


def settings_problems(settings: Any, where: Mapping[str, str] | None = None) -> list[Problem]:
    """Every field outside its bounds, then whatever the settings' own ``problems()`` method
    reports. ``where`` names fields as the user wrote them (e.g. flags)."""
    problems = list(_bound_problems(settings, where or {}))
    extra = getattr(settings, "problems", None)
    if callable(extra):
        problems += extra()
    return problems


def _bound_problems(settings: Any, where: Mapping[str, str]) -> Iterator[Problem]:
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if dataclasses.is_dataclass(value):
            yield from _bound_problems(value, where)
            continue
        low, high = f.metadata.get("minimum"), f.metadata.get("maximum")
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        name = where.get(f.name) or f"--{flag_name(f)}"
        if isinstance(value, float) and not math.isfinite(value):
            yield Problem(name, f"must be a finite number, got {value}")
        elif low is not None and value < low:
            yield Problem(name, f"must be at least {_number(low)}, got {_number(value)}")
        elif f.metadata.get("above") is not None and value <= f.metadata["above"]:
            yield Problem(name, f"must be above {_number(f.metadata['above'])}, got {_number(value)}")
        elif high is not None and value > high:
            yield Problem(name, f"must be at most {_number(high)}, got {_number(value)}")


def _number(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else f"{x:,}"
