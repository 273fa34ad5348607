"""Where shardflow puts things by default: one name for each place, and the check for names that
become part of a path."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rec.errors import Problem

DEFAULT_OUT = "out"  # flows write OUT/plan and OUT/train
PLAN_SUBDIR = "plan"
TRAIN_SUBDIR = "train"
DEFAULT_STATE_DIR = ".shardflow"  # shardflow's own state: the outbox and the plan cache
OUTBOX = "outbox"
PLAN_CACHE = "plan-cache"
MAX_NAME_BYTES = 255  # a file name's limit on common file systems
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # kept as it is in a directory name


def in_work_dir(work_dir: str | None, default: str) -> str:
    """A default place (``DEFAULT_OUT``, ``DEFAULT_STATE_DIR``, MLflow's database) inside
    ``work_dir``; without one, in the working directory, as the CLI keeps them."""
    return str(Path(work_dir, default)) if work_dir else default


def state_dir_in(work_dir: str | None, state_dir: str | None) -> str:
    """``state_dir``, or the default one in ``work_dir``."""
    return state_dir if state_dir is not None else in_work_dir(work_dir, DEFAULT_STATE_DIR)


def outbox_dir(state_dir: str) -> str:
    return _owned(state_dir, OUTBOX)


def plan_cache_dir(state_dir: str) -> str:
    return _owned(state_dir, PLAN_CACHE)


def _owned(state_dir: str, name: str) -> str:
    """``state_dir/name``, absolute; InputError where it is a link or no folder (``state_problems``)."""
    from rec.errors import InputError

    problems = state_problems(state_dir, (name,))
    if problems:
        raise InputError(f"Cannot use the state folder {state_dir}:", problems)
    return str(Path(Path(state_dir).resolve(), name))


def state_problems(state_dir: str, names: tuple[str, ...] = (OUTBOX, PLAN_CACHE)) -> list[Problem]:
    """The folders shardflow keeps in ``state_dir`` where one is a link or no folder: shardflow follows
    no link out of a folder it owns (its outbox and plan cache would be written elsewhere)."""
    from rec.safe_read import owned_link

    return [p for name in names if (p := owned_link(Path(state_dir, name))) is not None]


def unmakeable(path: str | None, flag: str) -> list[Problem]:
    """``path``, where shardflow makes a folder (``--out``, ``--state-dir``) and writes in it, where it
    cannot: it, or a folder above it, is a file; or the nearest folder there cannot be written (a
    read-only filesystem, no permission). Checked before Prefect starts: inside a flow it failed with
    tracebacks."""
    from rec.errors import Problem

    if not path:
        return []
    for above in (Path(path), *Path(path).parents):
        if above.is_dir():
            if not os.access(above, os.W_OK | os.X_OK):
                return [Problem(flag, f"{path}: {os.path.abspath(above)} cannot be written (a read-only "
                                      "filesystem, or no permission)")]
            return []
        if above.exists():
            return [Problem(flag, f"{path}: {above} is a file, not a folder")]
    return []


def name_problems(name: object) -> list[str]:
    """Why ``name`` (a user's name for something, e.g. an MLflow experiment) cannot be one
    directory name; empty if it can."""
    if not isinstance(name, str):
        return [f"must be text, got {type(name).__name__}"]
    if not name.strip():
        return ["is empty"]
    problems = []
    if "\0" in name:
        problems.append("contains a NUL character")
    elif not name.isprintable():
        problems.append("contains control characters")
    if "/" in name or "\\" in name:
        problems.append("contains a path separator ('/' or '\\'): give a name, not a path")
    if name in (".", ".."):
        problems.append(f"is {name!r}: a name for a directory, not a name")
    if name != name.strip():
        problems.append("starts or ends with white space")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        problems.append(f"is longer than {MAX_NAME_BYTES} bytes")
    return problems


def safe_dir_name(name: str) -> str:
    """One directory name for ``name`` that stays where it is put, whatever ``name`` holds: plain
    names as they are, others as their plain characters and a hash of the whole name."""
    if PLAIN_NAME.fullmatch(name):
        return name
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:60] or "name"
    return f"{slug}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
