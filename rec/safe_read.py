"""Reading files that someone else may have written (the outbox's records; other read-backs may
use it too): never through a symbolic link, only regular files, never more than a limit, never
blocking.

A path is opened below a folder the caller trusts (a descriptor), one component at a time, each with
``O_NOFOLLOW``: a link anywhere on the way is refused, not followed, so what is read stays inside
that folder. A file is checked before it is opened (``lstat``: a device is never opened) and after
(``fstat`` of what was opened, the same file); it is opened ``O_NONBLOCK``, so a FIFO swapped in
between cannot hang the reader. Reads stop at ``limit + 1`` bytes whatever size the file claims.

Every failure is an ``UnsafeFile`` that says in one line what the path is instead (a symbolic
link, a FIFO, a device, a folder, a file too big) or why it cannot be opened.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rec.errors import Problem
from rec.units import format_bytes

CHUNK = 1 << 20  # bytes per read: a large file is never asked for in one allocation
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | _NO_FOLLOW
_FILE = os.O_RDONLY | os.O_NONBLOCK | _NO_FOLLOW


class UnsafeFile(ValueError):
    """A path that is not what a reader may use (its message: the path and why, one line)."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path} {reason}")


def kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in a user's words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def owned_link(path: str | Path) -> Problem | None:
    """``path``, a folder shardflow makes inside one the user named (``OUT/logs``, ``OUT/checkpoints``,
    the state folder's outbox and plan cache), where it is a symbolic link or anything but a folder."""
    mode = os.lstat(path).st_mode if os.path.lexists(path) else None
    if mode is None or stat.S_ISDIR(mode):
        return None
    return Problem(str(path), f"is {kind(mode)}, not a folder: shardflow follows no link out of a folder it owns; "
                              "remove it")


def open_folder(name: str | Path, dir_fd: int | None = None) -> int:
    """A descriptor of the folder ``name`` (one component below ``dir_fd``, or a path the caller
    trusts up to its last component); UnsafeFile if that is a link or anything but a folder
    (FileNotFoundError if nothing is there)."""
    return _open_below(name, dir_fd, str(name))


@contextmanager
def folder(name: str | Path, dir_fd: int | None = None) -> Iterator[int]:
    """``open_folder``, closed after the block."""
    fd = open_folder(name, dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def open_file(relative: str, dir_fd: int, limit: int) -> int:
    """A descriptor of the regular file ``relative`` (``/``-separated, below ``dir_fd``) of at
    most ``limit`` bytes, with no link on the way; UnsafeFile otherwise (FileNotFoundError if it
    simply does not exist)."""
    *folders, name = _parts(relative)
    opened: list[int] = []
    try:
        parent = dir_fd
        for part in folders:
            parent = _open_below(part, parent, relative)
            opened.append(parent)
        return _open_regular(name, parent, relative, limit)
    finally:
        for fd in opened:
            os.close(fd)


def read_file(relative: str, dir_fd: int, limit: int) -> bytes:
    """The bytes of ``open_file(relative, dir_fd, limit)``."""
    fd = open_file(relative, dir_fd, limit)
    try:
        return read_fd(fd, limit, relative)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int, name: str) -> bytes:
    """At most ``limit`` bytes from ``fd``: UnsafeFile as soon as there are more, whatever the file
    claimed its size to be (a file that grows, or ``/proc``'s)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise UnsafeFile(name, f"holds more than {format_bytes(limit)}, the most read for it")


def copy_file(relative: str, dir_fd: int, limit: int, dest: Path) -> None:
    """Copy the regular file ``relative`` below ``dir_fd`` (``open_file``) to ``dest``, a path the
    caller owns, stopping at ``limit`` bytes."""
    fd = open_file(relative, dir_fd, limit)
    try:
        with open(dest, "wb") as out:
            total = 0
            while chunk := os.read(fd, CHUNK):
                total += len(chunk)
                if total > limit:
                    raise UnsafeFile(relative, f"holds more than {format_bytes(limit)}, the most read for it")
                out.write(chunk)
    finally:
        os.close(fd)


def _parts(relative: str) -> list[str]:
    parts = relative.split("/")
    if not relative or relative.startswith("/") or "\0" in relative \
            or any(part in ("", ".", "..") for part in parts):
        raise UnsafeFile(repr(relative), "is not a relative path inside its folder")
    return parts


def _open_below(part: str | Path, parent: int | None, relative: str) -> int:
    try:
        return os.open(part, _FOLDER, dir_fd=parent)
    except OSError as e:
        raise _unsafe(relative, e, part, parent) from None


def _open_regular(name: str, parent: int, relative: str, limit: int) -> int:
    try:
        before = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _unsafe(relative, e, name, parent) from None
    if not stat.S_ISREG(before.st_mode):  # checked before opening: a device is never opened
        raise UnsafeFile(relative, f"is {kind(before.st_mode)}, not a regular file")
    try:
        fd = os.open(name, _FILE, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _unsafe(relative, e, name, parent) from None
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise UnsafeFile(relative, "was replaced while it was opened")
        if after.st_size > limit:
            raise UnsafeFile(relative, f"is {format_bytes(after.st_size)}, more than the "
                                       f"{format_bytes(limit)} read for it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unsafe(path: str, error: OSError, name: str | Path, dir_fd: int | None) -> OSError | UnsafeFile:
    """Why ``name`` could not be opened: what it is instead, where that is the cause."""
    if error.errno == errno.ENOENT:
        return FileNotFoundError(errno.ENOENT, "no such file", path)
    if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            return UnsafeFile(path, "is a symbolic link, not followed")
        if mode and error.errno == errno.ENOTDIR:
            return UnsafeFile(path, f"is {kind(mode)}, not a folder")
        if mode and error.errno == errno.EISDIR:
            return UnsafeFile(path, "is a folder, not a file")
    return UnsafeFile(path, f"cannot be opened ({error.strerror or error})")
