"""A user's input file (spec, topology, profile): what is wrong with the path, its bytes, its UTF-8
text, and for the YAML files (topology, profile) the one document it holds.

Each failure is an ``InputError`` that says what the path is (a directory, a device, a broken
symbolic link, a link loop ...) rather than the operating system's bare error.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from rec.errors import InputError, Problem
from rec.units import format_bytes

# Far above any real input (a 1,000,000-table YAML spec is about 120 MB) and small enough that a
# wrong file (a disk image, a log) fails at once instead of filling memory.
MAX_SPEC_FILE_BYTES = 1 << 30
MAX_TOPOLOGY_FILE_BYTES = 1 << 20
YAML_EXTENSIONS = (".yaml", ".yml", ".json")  # JSON is YAML too


CHUNK_BYTES = 1 << 20


def read_at_most(f: BinaryIO, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``f`` (one more than ``limit`` says the file is larger), read in
    chunks: ``f.read(limit + 1)`` allocates all of it first (1 GiB for a 400-byte spec, a MemoryError
    under ``ulimit -v``)."""
    chunks, size = [], 0
    while size <= limit:
        chunk = f.read(min(CHUNK_BYTES, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read_bytes(path: Path, what: str, limit: int) -> bytes:
    """The file's bytes; InputError if it is not a readable regular file of at most ``limit`` bytes."""
    title = f"Cannot read {what} {path}"
    if "\0" in str(path):
        raise InputError(title, [Problem(str(path), "the path contains a NUL character")])
    try:
        info = os.stat(path)
    except OSError as e:
        raise InputError(title, [Problem(str(path), path_failure(path, e))]) from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(title, [Problem(str(path), "is a directory, not a file")])
    if not stat.S_ISREG(info.st_mode):
        reason = "is not a regular file (a device, pipe or socket); give the path of a file"
        raise InputError(title, [Problem(str(path), reason)])
    if info.st_size > limit:
        raise InputError(title, [Problem(str(path), _too_big(info.st_size, limit, what))])
    try:
        with open(path, "rb") as f:
            data = read_at_most(f, limit)  # the size can change (or lie, in /proc) between stat and read
    except OSError as e:
        raise InputError(title, [Problem(str(path), path_failure(path, e))]) from None
    if len(data) > limit:
        raise InputError(title, [Problem(str(path), _too_big(len(data), limit, what))])
    return data


def decode_utf8(data: bytes, path: Path, what: str) -> str:
    """``data`` as text; InputError naming the first byte that is not UTF-8. A leading BOM is dropped."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        reason = (f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}, line {line}); "
                  "save it as UTF-8")
        raise InputError(f"Cannot read {what} {path}", [Problem(str(path), reason)]) from None


def read_text(path: Path, what: str, limit: int) -> str:
    """The file's UTF-8 text (see ``read_bytes`` and ``decode_utf8``)."""
    return decode_utf8(read_bytes(path, what, limit), path, what)


def read_yaml_file(path: str | Path, what: str, limit: int, when_empty: str) -> object:
    """The one YAML (or JSON) document in ``path``; InputError for another extension, a file
    ``read_text`` refuses, text that is no document, or an empty file (``when_empty`` says what to write)."""
    from rec.documents import DocumentError, load_json, load_yaml

    path = Path(path)
    title = f"Cannot read {what} {path}"
    if path.suffix.lower() not in YAML_EXTENSIONS:
        reason = f"unsupported extension (use one of {', '.join(YAML_EXTENSIONS)})"
        raise InputError(title, [Problem(str(path), reason)])
    text = read_text(path, what, limit)
    try:
        document = load_yaml(text)
    except DocumentError as e:
        if path.suffix.lower() != ".json":
            raise InputError(title, [Problem(str(path), str(e))]) from None
        try:  # read as YAML (JSON's superset, but for a few characters YAML refuses): JSON's own word
            document = load_json(text)
        except DocumentError as as_json:
            raise InputError(title, [Problem(str(path), str(as_json))]) from None
    if document is None:
        raise InputError(title, [Problem(str(path), f"the file is empty ({when_empty})")])
    return document


def path_failure(path: Path, error: OSError) -> str:
    """Why ``path`` cannot be opened, in the user's terms."""
    code = error.errno
    if code == errno.ENOENT:
        if os.path.islink(path):
            return f"is a broken symbolic link (to {os.readlink(path)}, which does not exist)"
        return "no such file"
    if code == errno.ELOOP:
        return "is a symbolic link loop (a link that leads back to itself)"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied (check the permissions of the file and of its directories)"
    if code == errno.ENOTDIR:
        return "no such file (a part of the path is a file, not a directory)"
    if code == errno.ENAMETOOLONG:
        return "the path is too long"
    if code == errno.EISDIR:
        return "is a directory, not a file"
    return error.strerror or str(error)


def _too_big(size: int, limit: int, what: str) -> str:
    return (f"is {format_bytes(size)}, more than the {format_bytes(limit)} shardflow reads for a {what} "
            "(is this the right file?)")
