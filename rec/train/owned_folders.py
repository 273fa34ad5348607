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
import stat
from pathlib import Path

from rec.errors import Problem
from rec.safe_read import kind

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
            mode = entry.stat(follow_symlinks=False).st_mode
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


def owned_link(path: str | Path) -> Problem | None:
    """``path``, a folder shardflow makes inside one the user named (``OUT/logs``, ``OUT/checkpoints``),
    where it is a symbolic link or anything but a folder."""
    mode = os.lstat(path).st_mode if os.path.lexists(path) else None
    if mode is None or stat.S_ISDIR(mode):
        return None
    return Problem(str(path), f"is {kind(mode)}, not a folder: shardflow follows no link out of a folder it owns; "
                              "remove it")
