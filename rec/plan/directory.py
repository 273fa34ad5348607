"""A plan directory (docs/plan-format.md): read as plan.json with its shards.parquet checked against
it, written as a unit.

Writing is atomic with plan.json as the commit point: every file is written in a private temporary
directory, files of an earlier plan that the new one does not have are removed, and the new files
are moved into place, plan.json last. A reader that finds plan.json finds the shards.parquet of the
same plan, or a newer one if a writer crashed in between: reading a plan directory checks its
shards.parquet against plan.json (``shards_problems``). A write that fails (a full disk) leaves
the directory as it was.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from rec.errors import InputError, Problem
from rec.file_lock import file_lock
from rec.plan.chart import CHART_FILE
from rec.plan.parse import parse_plan
from rec.plan.plan_json import PLAN_FILE, dumps_plan
from rec.plan.shards_file import (
    MOVEMENT_FILE,
    SHARDS_FILE,
    missing_shards,
    shards_problems,
    write_movement,
    write_shards,
)
from rec.plan.types import Plan

PLAN_FILES = (PLAN_FILE, SHARDS_FILE)  # what a plan is read from (``read_plan`` of its directory)
# Every file of a plan a directory may hold: a write removes those the new plan does not have (and
# those the caller names as its own, e.g. the plan cache's digest).
PLAN_DIR_FILES = (PLAN_FILE, SHARDS_FILE, CHART_FILE, MOVEMENT_FILE)
TMP_PREFIX = ".tmp-plan-"
WRITE_LOCK = ".plan-write.lock"


def plan_file(path: str | Path) -> Path:
    """The plan.json that ``path`` names: the file itself, or the one in the directory."""
    path = Path(path)
    return path / PLAN_FILE if path.is_dir() else path


def read_plan(path: str | Path) -> Plan:
    """The plan in ``path`` (plan.json or its directory); InputError for anything that is not one.
    The shards.parquet beside plan.json is checked against it: a directory must have one, a
    plan.json named on its own is complete without it."""
    from rec.input_files import MAX_SPEC_FILE_BYTES, read_text

    directory = Path(path).is_dir()
    path = plan_file(path)
    shards = path.parent / SHARDS_FILE
    try:
        plan = parse_plan(read_text(path, "the plan", MAX_SPEC_FILE_BYTES), path)
    except InputError as e:  # a directory without its shards.parquet is named beside plan.json's problems
        if directory and not os.path.lexists(shards) and e.problems:
            raise InputError(e.title, [*e.problems, missing_shards(shards)]) from None
        if not directory and e.problems and _not_a_plan(path):
            raise InputError(e.title, [*e.problems, Problem(str(path), (
                f"a {path.suffix} file is a spec, a topology or data, not a plan: a plan is the directory (or "
                f"its plan.json) that `shardflow plan` writes"))]) from None
        raise
    if directory or os.path.lexists(shards):
        problems = shards_problems(plan, shards)
        if problems:
            raise InputError(f"Cannot use the plan in {path.parent}:", problems)
    return plan


def _not_a_plan(path: Path) -> bool:
    """Whether ``path`` is named as a spec, a topology or data are (a plan's own files aside)."""
    from rec.spec.read import FORMATS

    suffix = path.suffix.lower()
    return suffix in FORMATS and suffix != ".json" and path.name not in PLAN_DIR_FILES


def write_plan(plan: Plan, out_dir: str | Path,
               extra: Callable[[Path], None] | None = None, owned: tuple[str, ...] = ()) -> Path:
    """Write the plan (``write_plan_files``); returns the path of plan.json."""
    return write_plan_files(plan, out_dir, extra, owned)[0]


def write_plan_files(plan: Plan, out_dir: str | Path, extra: Callable[[Path], None] | None = None,
                     owned: tuple[str, ...] = ()) -> tuple[Path, ...]:
    """Write plan.json and shards.parquet (movement.parquet for a replanned plan, and what
    ``extra(tmp_dir)`` adds once those are in ``tmp_dir``) as one unit: the files of an earlier
    plan in ``out_dir`` that this one does not have are removed (those of ``PLAN_DIR_FILES`` and
    ``owned``, the names of the caller's own files), plan.json is replaced last. Returns the files
    written, plan.json first. A failed write leaves ``out_dir`` as it was and raises the OSError (out
    of space: ``rec.disk_full.DISK_FULL_ERRNOS``) naming the file by its path in ``out_dir``, never
    the temporary one."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with file_lock(out / WRITE_LOCK, removed=True):  # concurrent writers into one directory take turns
        return _write_plan_files(plan, out, extra, (*PLAN_DIR_FILES, *owned))


def _write_plan_files(plan: Plan, out: Path, extra: Callable[[Path], None] | None,
                      known: tuple[str, ...]) -> tuple[Path, ...]:
    _remove_abandoned(out)
    tmp = out / f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    writing = out
    try:
        tmp.mkdir()
        writing = out / SHARDS_FILE
        write_shards(plan, tmp / SHARDS_FILE)
        if plan.metrics.movement is not None:
            writing = out / MOVEMENT_FILE
            write_movement(plan.metrics.movement, tmp / MOVEMENT_FILE)
        writing = out / PLAN_FILE
        (tmp / PLAN_FILE).write_text(dumps_plan(plan), encoding="utf-8")
        if extra is not None:
            writing = out
            before = set(os.listdir(tmp))
            try:
                extra(tmp)
            except OSError:
                made = sorted(set(os.listdir(tmp)) - before)  # a write names no file: the one it made does
                writing = out / made[0] if len(made) == 1 else out
                raise
        names = sorted(os.listdir(tmp), key=lambda n: _listed_order(n, known))  # plan.json first
        _check_replaceable(out, [*names, *(set(known) - set(names))])
        for name in set(known) - set(names):  # an earlier plan's, e.g. a chart or movement
            if (out / name).is_file() or (out / name).is_symlink():
                (out / name).unlink()
        for name in sorted(names, key=lambda n: n == PLAN_FILE):  # plan.json last: the commit point
            os.replace(tmp / name, out / name)
    except OSError as e:
        inside = e.filename is not None and Path(str(e.filename)).parent == tmp
        if inside:  # the file it failed on (the chart: rank_load.png), by its name in the plan's directory
            writing = out / Path(str(e.filename)).name
        if e.errno is not None and (e.filename is None or inside):  # never the temporary path
            raise OSError(e.errno, os.strerror(e.errno), str(writing)) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tuple(out / name for name in names)


def _check_replaceable(out: Path, names: list[str]) -> None:
    """OSError naming the first of ``names`` in ``out`` that a plan's file cannot replace or remove (a
    directory), before anything in ``out`` changes: a write that fails half-way would leave the new
    shards.parquet beside the old plan.json."""
    for name in names:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))


def _listed_order(name: str, known: tuple[str, ...]) -> tuple[int, str]:
    return (known.index(name) if name in known else len(known), name)


def _remove_abandoned(out: Path) -> None:
    """Temporary directories of writers on this host that died (SIGKILL) before cleaning up."""
    host = socket.gethostname()
    for tmp in out.glob(f"{TMP_PREFIX}{host}-*"):
        try:
            pid = int(tmp.name.removeprefix(f"{TMP_PREFIX}{host}-").split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


