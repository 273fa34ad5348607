"""File locks (``flock(2)``), taken one way wherever shardflow takes one.

A lock file sits in a directory shardflow owns (an output directory, the outbox, a plan cache
entry, beside a SQLite store) and is opened without following a symbolic link (``O_NOFOLLOW``) and
without waiting on a FIFO (``O_NONBLOCK``): a link planted in its place would otherwise take the
lock on, or write to, a file anywhere. Anything but a regular file at its path is moved aside
(``NAME.not-a-file-<ns>``) and a new file made. The lock belongs to the open file: closing it lets
go, also when the process dies.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from rec.disk_full import writing

NOT_A_FILE = "{name}.not-a-file-{ns}"  # where something else in a lock file's place goes
# What opening a path that holds no regular file fails with: a link (O_NOFOLLOW), a directory
# opened for writing, a FIFO or socket without a reader.
_NOT_A_FILE_ERRNOS = frozenset({errno.ELOOP, errno.EISDIR, errno.ENXIO})


def open_lock_file(path: str | Path, *, write: bool = False) -> int:
    """A descriptor of the lock file ``path``, created (mode 0600) if missing; ``write`` to write
    to it as well. Never through a link, never anything but a regular file (see the module)."""
    path = Path(path)
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for first in (True, False):
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as e:
            if not first or e.errno not in _NOT_A_FILE_ERRNOS:
                raise
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
        if first:
            with suppress(FileNotFoundError):  # another process may have moved it first
                os.replace(path, path.with_name(NOT_A_FILE.format(name=path.name, ns=time.time_ns())))
    raise OSError(errno.EEXIST, "not a regular file, and it cannot be moved aside", str(path))


def take(fd: int, *, shared: bool = False, blocking: bool = True) -> None:
    """Lock ``fd`` exclusively, or ``shared`` (a held lock changes kind); without ``blocking``,
    BlockingIOError at once when another open file holds it in a kind that excludes this one."""
    fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB))


def release(fd: int) -> None:
    """Let go of ``fd``'s lock (for every process that shares this open file)."""
    fcntl.flock(fd, fcntl.LOCK_UN)


@contextmanager
def holding(fd: int, *, shared: bool = False, blocking: bool = True) -> Iterator[int]:
    """Hold ``fd``'s lock for the block (``take``'s arguments), then close ``fd``, also when
    taking the lock failed."""
    try:
        take(fd, shared=shared, blocking=blocking)
        try:
            yield fd
        finally:
            release(fd)
    finally:
        os.close(fd)


@contextmanager
def file_lock(path: str | Path, *, shared: bool = False, blocking: bool = True,
              removed: bool = False) -> Iterator[int]:
    """Hold the lock of the file ``path`` for the block: exclusive, or ``shared``; without
    ``blocking``, BlockingIOError at once if it is taken. Yields the (read-only) descriptor.

    ``removed``: the lock file is gone again when an exclusive holder lets go (none is left beside a
    user's files). Every taker of such a lock then checks that the file it locked is still the one
    at ``path`` (a holder may have removed it meanwhile) and takes the new one if not."""
    if not removed:
        with holding(open_lock_file(path), shared=shared, blocking=blocking) as fd:
            yield fd
        return
    while True:
        fd = open_lock_file(path)
        try:
            take(fd, shared=shared, blocking=blocking)
        except BaseException:
            os.close(fd)
            raise
        if _still_at(fd, path):
            break
        os.close(fd)  # taken from a holder that removed it: lock the file now at the path
    try:
        yield fd
    finally:
        if not shared:
            with suppress(FileNotFoundError):
                os.unlink(path)  # while holding it: a later taker finds the path empty or new
        release(fd)
        os.close(fd)


def _still_at(fd: int, path: str | Path) -> bool:
    try:
        at_path = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)


RELEASE_WAIT_S = 5.0  # how long a finishing launcher waits for its ranks to let go of a lock


def alone(fd: int, wait_s: float = RELEASE_WAIT_S) -> bool:
    """Whether this process is (within ``wait_s``) the lock's only holder: the ranks it started let go
    as they exit. Then it holds the lock exclusively."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            take(fd, blocking=False)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def holding_directory(directory: str | Path, lock_name: str, holder: str, refused: Callable[[str], Exception],
                      max_holder_bytes: int) -> Iterator[Path]:
    """Hold ``directory`` for the block through its lock file ``lock_name``: taken exclusively at
    once (``refused(what the holder wrote)``, at most ``max_holder_bytes`` of it, is raised when any
    other process holds it), ``holder`` written in it, then held shared, so that processes this one
    starts can take it shared too (yields the lock file's path) and the directory stays taken while
    any of them lives. The text is cleared when this process is its last holder at the end; a
    directory the block created and left holding only the lock file is removed."""
    path = Path(directory)
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    lock = path / lock_name
    try:
        fd = open_lock_file(lock, write=True)
        try:
            try:
                take(fd, blocking=False)
            except BlockingIOError:
                raise refused(os.pread(fd, max_holder_bytes, 0).decode("utf-8", "replace")) from None
            with writing(lock):
                _write(fd, holder)
            take(fd, shared=True)  # from exclusive: no other process could take it meanwhile
            try:
                yield lock
            finally:
                if alone(fd):  # every process that joined has let go: the directory is free again
                    _write(fd, "")
                release(fd)
        finally:
            os.close(fd)
    finally:
        if created:  # a run that wrote nothing there leaves nothing behind
            with suppress(OSError):
                if [p.name for p in path.iterdir()] == [lock.name]:
                    lock.unlink()
                    path.rmdir()


def _write(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
