"""An output that cannot be written because its filesystem is full, over quota or over the file
size limit: one error naming the path, instead of whatever the writing library raised around it.

``writing(path)`` wraps the code writing an output; a disk-full ``OSError`` anywhere behind what it
raises (its causes, and the per-rank failures torch.distributed.checkpoint collects) becomes
``DiskFull``. ``write_whole(path, data)`` writes a small output beside it and renames it over, so
that a reader, or a failed write, never sees half a file. No torch here: the launcher uses it too.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class DiskFull(Exception):
    """``path`` could not be written: no space left, quota exceeded or file too large. Not an
    ``OSError``: the CLI reports an unusable input path as bad input (exit 2), this is a fault of
    the machine (exit 1)."""

    def __init__(self, path: str | Path, error: OSError):
        self.path = str(path)
        self.errno = error.errno or errno.ENOSPC
        # The OS's words: Arrow's say "Error writing bytes to file. Detail: [errno 28] No space left on device"
        known = self.errno in DISK_FULL_ERRNOS
        self.reason = os.strerror(self.errno) if known else error.strerror or os.strerror(self.errno)
        super().__init__(f"cannot write {self.path}: {self.reason}")

    def __reduce__(self) -> tuple[object, ...]:  # copied between processes (Prefect states)
        return _rebuild, (self.path, self.errno, self.reason)


def _rebuild(path: str, number: int, reason: str) -> DiskFull:
    return DiskFull(path, OSError(number, reason))


class CheckpointWriteFailed(Exception):
    """The OS would not write a checkpoint's file, for another reason than a full disk: the error
    torch.save's zip writer made of it ("unexpected pos") says neither the file nor the reason."""

    def __init__(self, error: OSError, step: str | Path):
        reason = error.strerror or (os.strerror(error.errno) if error.errno else str(error))
        super().__init__(f"cannot write {error.filename or step}: {reason}")


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS


def find_cause(error: BaseException, matches: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception behind ``error`` that ``matches``: ``error`` itself, its causes and
    contexts, or one of the failures a torch.distributed.checkpoint ``CheckpointException``
    carries (``failures``: rank -> (exception, traceback))."""
    seen: set[int] = set()
    pending: list[object] = [error]
    while pending:
        current = pending.pop()
        if isinstance(current, tuple) and current:
            current = current[0]
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if matches(current):
            return current
        pending += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            pending += list(failures.values())
    return None


def disk_full_cause(error: BaseException) -> OSError | None:
    """The disk-full ``OSError`` behind ``error``, if any."""
    found = find_cause(error, is_disk_full)
    return found if isinstance(found, OSError) else None


@contextmanager
def writing(path: str | Path, named: bool = False) -> Iterator[None]:
    """Turn a disk-full error raised while writing ``path`` into ``DiskFull`` naming it (or the
    file the OS named, unless ``named``: a failed copy names its source)."""
    try:
        yield
    except DiskFull:
        raise
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        cause = disk_full_cause(e)
        if cause is None:
            raise
        raise DiskFull(path if named else cause.filename or path, cause) from e


def write_whole(path: str | Path, data: bytes | str) -> None:
    """Write ``path`` beside it (``.NAME.tmp``) and rename it over: the old file stays whole if
    writing fails (a full disk raises ``DiskFull``)."""
    with whole(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


MAX_NAME_BYTES = 255  # a file name's limit on every common filesystem


def temporary_name(name: str) -> str:
    """``.NAME.tmp``, the name a file is written under before it is renamed to ``name``; for a name too
    long to take 5 more bytes (a legal 251-255-byte ``--out``), ``.NAME`` cut to fit, same suffix."""
    tmp = f".{name}.tmp"
    if len(os.fsencode(tmp)) <= MAX_NAME_BYTES:
        return tmp
    cut = os.fsencode(name)[: MAX_NAME_BYTES - len(".~.tmp")].decode("utf-8", "ignore")  # no half character
    return f".{cut}~.tmp"


@contextmanager
def whole(path: str | Path) -> Iterator[Path]:
    """The block writes the path it is given (``.NAME.tmp`` beside ``path``), which is renamed over
    ``path`` when the block ends, or removed if it fails: ``path`` is never half written (a full
    disk raises ``DiskFull``)."""
    path = Path(path)
    tmp = path.with_name(temporary_name(path.name))
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            yield tmp
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
