"""Reading a checkpoint while its training goes on: the step being read is held, and pruning skips it.

A training keeps its newest checkpoints and deletes the older ones as it writes new ones
(``rec.train.checkpoint.prune``). ``export``, ``eval`` and a training ``--resume-from`` another one
read a step of a directory that training may still be writing: the step LATEST named when they
looked can be deleted while they read it. So a reader holds the step directory's lock shared
(``flock`` on the directory itself: nothing is written where the reader may have no right to write)
for as long as it reads, and ``prune`` deletes a step only where it takes that lock exclusively at
once; a held step is left for a later checkpoint's pruning. A step that went between LATEST naming it
and the lock is looked up again.

Where the filesystem has no ``flock`` (some network filesystems), nothing is held: readers and pruning
behave as before. Torch-free: the launcher holds the step for its ranks.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rec.errors import InputError, Problem
from rec.file_lock import release, take
from rec.train.resume import INDEX_FILE, NoLatestStep, checkpoint_at, step_dir

TRIES = 5  # lookups of LATEST while a training prunes the steps it named; each waits RETRY_S more
RETRY_S = 0.05
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What flock fails with where a filesystem does not lock.
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})


@contextmanager
def held_checkpoint(path: str | Path, title: str = "", hint: str = "") -> Iterator[tuple[Path, int]]:
    """The checkpoint ``path`` names (``rec.train.resume.checkpoint_at``: its checkpoint directory and
    step), held for the block: its training's pruning leaves that step alone until the block ends."""
    refused: NoLatestStep | None = None
    for attempt in range(TRIES):
        if attempt:
            time.sleep(RETRY_S * attempt)
        try:
            directory, step = checkpoint_at(path, title, hint)
        except NoLatestStep as e:  # LATEST named a step pruned before it was looked at: look again
            refused = e
            continue
        fd = _hold(step_dir(directory, step))
        if fd is None:
            continue
        try:
            yield directory, step
        finally:
            if fd >= 0:
                release(fd)
                os.close(fd)
        return
    if refused is not None:
        raise refused
    raise InputError(title or f"Cannot use the checkpoint {path}:", [Problem(str(path), (
        f"its training deleted each step LATEST named before it could be read ({TRIES} tries): keep more "
        "checkpoints there (--keep-checkpoints), or read one step directory of it"))])


def _hold(step: Path) -> int | None:
    """A descriptor of ``step`` holding its lock shared (-1 where the filesystem does not lock); None
    where the step is gone or is being deleted."""
    try:
        fd = os.open(step, _DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        take(fd, shared=True, blocking=False)
    except BlockingIOError:  # pruning holds it: it is being deleted
        os.close(fd)
        return None
    except OSError as e:
        os.close(fd)
        if e.errno in _NO_LOCKS:
            return -1 if (step / INDEX_FILE).is_file() else None
        raise
    if not (step / INDEX_FILE).is_file():  # deleted before the lock was taken
        release(fd)
        os.close(fd)
        return None
    return fd


def delete_unless_held(step: Path) -> bool:
    """Delete the step directory ``step`` unless a reader holds it (``held_checkpoint``); whether it went."""
    try:
        fd = os.open(step, _DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return True
    try:
        try:
            take(fd, blocking=False)
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                raise
        shutil.rmtree(step, ignore_errors=True)
        return True
    finally:
        os.close(fd)
