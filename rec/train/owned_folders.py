"""The folders a training writes and reads back (its logs, its checkpoints) hold only folders and
regular files: shardflow follows no symbolic link out of a folder it owns and opens no FIFO or device
there (docs/security.md). One found is named before anything is read or launched, exit 2: a link to
a folder elsewhere would have the checkpoints or logs written there, a link to a file appended to or
read as the checkpoint's, a FIFO would block the reader for good. The folder named by the user
(``--out``, ``--checkpoint-dir``, ``--checkpoint``) may itself be a link: that is the user's path.

Torch-free: the launcher checks before starting any process.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from rec.errors import Problem
from rec.plan.types import PLAN_FORMAT
from rec.safe_read import kind, owned_link
from rec.train.model_file import MODEL_FORMAT

DEPTH = 2  # a checkpoint directory's files, and its step directories' files


def foreign_entries(folder: str | Path, depth: int = DEPTH) -> list[Problem]:
    """Every symbolic link, FIFO, socket or device in ``folder`` and in its folders, ``depth`` levels
    deep (none where ``folder`` is not there)."""
    out: list[Problem] = []
    pending = [(Path(folder), 1)]
    while pending:
        here, level = pending.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except FileNotFoundError:  # deleted since it was listed: a training pruning its old steps
                continue
            if stat.S_ISDIR(mode):
                if level < depth:
                    pending.append((Path(entry.path), level + 1))
            elif not stat.S_ISREG(mode):
                out.append(Problem(entry.path, f"is {kind(mode)}: shardflow follows no link and opens no special "
                                               "file in a folder it owns; remove it"))
    return sorted(out, key=lambda p: p.where)


def folder_problems(folder: str | Path, made: bool, depth: int = DEPTH) -> list[Problem]:
    """``folder`` where it is not one (``made``: shardflow makes it inside a folder the user named, so it
    must not be a link), else what ``foreign_entries`` finds in it."""
    linked = owned_link(folder) if made else None
    return [linked] if linked is not None else foreign_entries(folder, depth)


# What a training writes where its checkpoints go, beside its step directories: the plan copy, model.json,
# LATEST, the nodes' lock files, and the temporary files of each (``rec.disk_full.whole``).
_TOP_FILES = r"LATEST|model\.json|plan\.json"
_TOP = re.compile(rf"(?:{_TOP_FILES})|\.(?:{_TOP_FILES})\.tmp|\.shardflow-checkpoints-node\d+\.lock")
# In a step directory: torch.distributed.checkpoint's index and data files (and its index's temporary
# file), the run that wrote it and the data's position.
_STEP = re.compile(r"(?:__\d+)?\.metadata(?:\.tmp)?|__\d+_\d+\.distcp|\.?(?:run|data_position)\.json(?:\.tmp)?")
_WRITTEN_BY = {name: written.rsplit("/", 1)[0] + "/"  # any version of the format: "shardflow.plan/"
               for name, written in (("model.json", MODEL_FORMAT), ("plan.json", PLAN_FORMAT))}
_FORMAT = re.compile(rb'\s*\{\s*"format"\s*:\s*"([^"]{1,64})"')


def unwritten_entries(checkpoints: str | Path) -> list[Problem]:
    """What a training that writes into ``checkpoints`` would overwrite or prune there but did not
    write: a file or folder of another name, a file in a step directory, or a ``model.json`` or
    ``plan.json`` that is not shardflow's. None where ``checkpoints`` is not there."""
    from rec.train.resume import step_of

    root = Path(checkpoints)
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[str] = []
    for entry in entries:
        if step_of(entry.name) is not None and entry.is_dir(follow_symlinks=False):
            found += [f"{entry.path}/{e.name}" for e in sorted(os.scandir(entry.path), key=lambda e: e.name)
                      if not _STEP.fullmatch(e.name)]
        elif not _TOP.fullmatch(entry.name) or not _written_by_shardflow(Path(entry.path)):
            found.append(entry.path)
    reason = ("a training would write over or prune it, but shardflow did not write it there: give the training "
              "an empty or new --checkpoint-dir, or move it")
    return [Problem(path, reason) for path in found]


def _written_by_shardflow(path: Path) -> bool:
    """A top-level file of a checkpoint directory, as far as its name and first bytes tell."""
    prefix = _WRITTEN_BY.get(path.name)
    if prefix is None:
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    match = _FORMAT.match(head)
    return match is not None and match.group(1).decode("utf-8", "replace").startswith(prefix)


def output_problems(out_dir: str | Path, names: tuple[str, ...]) -> list[Problem]:
    """Each of the files ``names`` a run writes into ``out_dir`` at its end where a folder stands in
    its place: the run would fail there after all its work."""
    return [Problem(str(Path(out_dir) / name), "is a folder, where the run writes this file: remove or move it")
            for name in names if (Path(out_dir) / name).is_dir() and not (Path(out_dir) / name).is_symlink()]
