"""A user's Python target, ``package.module:function`` or ``path/to/file.py:function``: imported and
looked up, with every failure one line (``spec from-model``, ``train --model``). Runs the user's code."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rec.errors import InputError, Problem, show


def target_function(target: str) -> Callable[[], Any]:
    """The function ``target`` names, imported; InputError for anything else."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise bad_target(target, "expected package.module:function or path/to/file.py:function")
    try:
        module = _import(where)
    except (InputError, KeyboardInterrupt):
        raise
    except BaseException as e:  # the user's code failed or exited as it was imported: theirs to see, in one line
        why = f"its code {ended_by(e)}" if isinstance(e, SystemExit) else one_line(e)
        raise bad_target(target, f"cannot import {where}: {why}") from None
    function = getattr(module, name, None)
    if function is None:
        raise bad_target(target, f"{where} has no attribute {name!r}")
    if not callable(function):
        raise bad_target(target, f"{where}.{name} is {kind_of(function)}, not a function")
    return function  # type: ignore[no-any-return]


def call_target(target: str, function: Callable[[], Any]) -> Any:
    """``function()``: the user's code. Whatever ends it other than returning — an exception, an
    exit (``sys.exit``, any code) or another BaseException — is an InputError naming ``target`` and
    what it did; a KeyboardInterrupt stays an interrupt."""
    try:
        return function()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # an exit too: sys.exit(0) must not pass for a model that was read
        instead = " instead of returning" if isinstance(e, SystemExit) else ""
        raise bad_target(target, f"{target}() {ended_by(e)}{instead}") from None


def ended_by(e: BaseException) -> str:
    """How a user's code ended with ``e``: ``called sys.exit(3)``, ``raised ValueError: ...``."""
    if isinstance(e, SystemExit):
        return f"called sys.exit({'' if e.code is None else show(e.code)})"
    return f"raised {one_line(e)}"


def _import(where: str) -> Any:
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise bad_target(where, f"no such file: {where}")
        sys.path.insert(0, str(path.resolve().parent))  # its sibling modules import as when run
        spec = importlib.util.spec_from_file_location(f"_shardflow_model_{abs(hash(str(path.resolve())))}", path)
        if spec is None or spec.loader is None:
            raise bad_target(where, f"cannot load {where} as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:  # `shardflow` runs from its own bin directory: import as `python -c` would
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(where)


def bad_target(target: str, reason: str) -> InputError:
    return InputError(f"Cannot read a model from {target}:", [Problem(target, reason)])


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def kind_of(value: object) -> str:
    return "None" if value is None else f"a {type(value).__name__}"
