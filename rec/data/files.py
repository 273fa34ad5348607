"""Where training data is: ``--data`` as a Parquet file, a directory, a glob, or a URI that a
pyarrow filesystem opens (``s3://``, ``gs://``, ``hdfs://`` where that filesystem is installed).

A directory holds every ``*.parquet``/``*.pq`` file under it (recursively; a file reached by several
paths through links, once); a glob every file it
matches, component by component as the shell matches (``**``: any number of components), unless the
path exists as it is written; both sorted by path, names starting with ``.`` or ``_`` left out (Spark's ``_SUCCESS``,
``.crc``), as pyarrow's datasets do. Only the files' footers are read here: their row groups and
row counts (``DataFiles``), from which the ranks split the rows (``rec.data.order``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from rec.errors import InputError, Problem, printable

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

PARQUET_SUFFIXES = (".parquet", ".pq")
GLOB_CHARACTERS = "*?["
MAX_FILES = 1_000_000


@dataclass(frozen=True)
class RowGroup:
    """One row group of one file: ``file`` indexes ``DataFiles.paths``."""

    file: int
    index: int
    rows: int


@dataclass(frozen=True, eq=False)
class DataFiles:
    """The Parquet files of a dataset, their row groups in path order, and their schemas."""

    source: str  # as the user gave it
    paths: tuple[str, ...]  # as ``filesystem`` names them
    row_groups: tuple[RowGroup, ...]
    schemas: tuple[tuple[int, pa.Schema], ...]  # each distinct schema, with the first file that has it
    filesystem: pafs.FileSystem
    fingerprint: str = field(default="")  # of the paths and row counts: the same files, the same rows
    stamp: str = field(default="")  # of the files' sizes and modification times: a file rewritten since
    file_schemas: tuple[int, ...] = ()  # per path, its schema's index in ``schemas`` (-1: left out unreadable)

    @property
    def rows(self) -> int:
        return sum(g.rows for g in self.row_groups)

    def parquet_file(self, file: int) -> pq.ParquetFile:
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.filesystem.open_input_file(self.paths[file]))

    def where(self, file: int, row: int) -> str:
        """A row for a message: ``row 17 of data/part-3.parquet``."""
        return f"row {row:,} of {self.paths[file]}"

    def unreadable(self, group: RowGroup, error: BaseException) -> Problem:
        """A row group Arrow cannot read although its footer was read: the file's pages are damaged,
        or the file changed since. Bad input either way (no retry reads it), named without Arrow's
        raw bytes."""
        said = printable(str(error).splitlines()[0] if str(error) else type(error).__name__, 200)
        return Problem(self.paths[group.file], (
            f"row group {group.index} cannot be read ({said}): the file is damaged, or was changed or replaced "
            "since it was opened"))


def open_data(source: str, what: str = "--data", unreadable: list[Problem] | None = None) -> DataFiles:
    """The files of ``source`` with their row groups; InputError naming every file that cannot be
    read as Parquet, or what is wrong with ``source`` itself (nothing there, no Parquet file, no rows).
    With ``unreadable`` (a check's, which names the other files' problems too), a file that cannot be
    read is added to it and left out, unless no file is left."""
    filesystem, paths = _list(source, what)
    problems: list[Problem] = []
    groups: list[RowGroup] = []
    schemas: list[tuple[int, pa.Schema]] = []
    file_schemas: list[int] = []
    digest = hashlib.sha256()
    stamp = hashlib.sha256()
    for info in filesystem.get_file_info(paths):
        stamp.update(f"{info.path}\0{info.size}\0{info.mtime_ns}\n".encode())
    for i, path in enumerate(paths):
        try:
            metadata = _metadata(filesystem, path)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            problems.append(Problem(f"{what} {path}", f"cannot read it as Parquet: {_reason(e)}"))
            file_schemas.append(-1)
            continue
        schema = metadata.schema.to_arrow_schema()
        known = next((k for k, (_, other) in enumerate(schemas) if schema.equals(other)), None)
        if known is None:
            known = len(schemas)
            schemas.append((i, schema))
        file_schemas.append(known)
        digest.update(f"{path}\0{metadata.num_rows}\0{metadata.num_row_groups}\n".encode())
        groups += [RowGroup(i, g, metadata.row_group(g).num_rows) for g in range(metadata.num_row_groups)
                   if metadata.row_group(g).num_rows > 0]
    if problems and (unreadable is None or not groups):
        raise InputError(f"Cannot read the data {source}:", problems)
    if unreadable is not None:
        unreadable += problems
    if not groups:
        raise InputError(f"Cannot read the data {source}:", [Problem(what, f"{source} holds no rows")])
    return DataFiles(source, tuple(paths), tuple(groups), tuple(schemas), filesystem, digest.hexdigest()[:16],
                     stamp.hexdigest()[:16], tuple(file_schemas))


def _list(source: str, what: str) -> tuple[pafs.FileSystem, list[str]]:
    """The filesystem of ``source`` and its Parquet files, sorted; InputError when there are none."""
    import pyarrow.fs as pafs

    title = f"Cannot read the data {source}:"
    if not source or "\0" in source:
        raise InputError(title, [Problem(what, "is empty or contains a NUL character")])
    # A path that holds a glob character but names a file or directory is that file or directory.
    magic = any(c in source for c in GLOB_CHARACTERS) and not _exists(source)
    base, glob = _glob_split(source) if magic else (source, "")
    try:
        filesystem, root = _filesystem(base)
        info = filesystem.get_file_info(root)
        if info.type == pafs.FileType.NotFound:
            raise InputError(title, [Problem(what, f"no such file or directory: {source}")])
        if info.type == pafs.FileType.File and not magic:
            return filesystem, [root]
        found = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    except (OSError, ValueError) as e:
        raise InputError(title, [Problem(what, f"cannot open {source}: {_reason(e)}")]) from None
    pattern = f"{root.rstrip('/')}/{glob}" if magic else None
    paths = sorted(f.path for f in found if f.type == pafs.FileType.File and _wanted(f.path, root, pattern))
    if isinstance(filesystem, pafs.LocalFileSystem):
        paths = _each_file_once(paths)
    if not paths:
        kind = "nothing it matches is a" if magic else "the directory holds no"
        raise InputError(title, [Problem(what, f"{source}: {kind} Parquet file "
                                               f"({'/'.join(PARQUET_SUFFIXES)}, not starting with . or _)")])
    if len(paths) > MAX_FILES:
        raise InputError(title, [Problem(what, f"{len(paths):,} files; at most {MAX_FILES:,}")])
    return filesystem, paths


def _each_file_once(paths: list[str]) -> list[str]:
    """``paths`` without those of a file already listed under another path: a link to a folder inside
    the data (or to the data's own folder, which the listing follows again and again), or a hard link,
    would otherwise have its rows read as many times."""
    seen: set[tuple[int, int] | str] = set()
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            file: tuple[int, int] | str = (st.st_dev, st.st_ino)
        except OSError:  # gone since the listing: its read names it
            file = os.path.realpath(path)
        if file not in seen:
            seen.add(file)
            out.append(path)
    return out


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``path`` (a URI's, else the local one) and the path in it."""
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), os.path.abspath(path))


def _exists(path: str) -> bool:
    import pyarrow.fs as pafs

    try:
        filesystem, root = _filesystem(path)
        return bool(filesystem.get_file_info(root).type != pafs.FileType.NotFound)
    except (OSError, ValueError):
        return False


def _glob_split(source: str) -> tuple[str, str]:
    """The directory a glob searches (its path up to the first component with a glob character) and
    the glob's components from there, as a pattern under that directory."""
    head, sep, rest = source.partition("://")
    parts = (rest if sep else head).split("/")
    fixed = []
    for part in parts:
        if any(c in part for c in GLOB_CHARACTERS):
            break
        fixed.append(part)
    base = "/".join(fixed) or ("/" if (rest if sep else head).startswith("/") else ".")
    return (f"{head}{sep}{base}" if sep else base), "/".join(parts[len(fixed):])


def _wanted(path: str, root: str, pattern: str | None) -> bool:
    relative = PurePosixPath(path[len(root):].lstrip("/")).parts
    if any(part.startswith((".", "_")) for part in relative):
        return False
    if pattern is not None:
        return _matches(path.split("/"), pattern.split("/"))
    return path.lower().endswith(PARQUET_SUFFIXES)


def _matches(parts: list[str], pattern: list[str]) -> bool:
    """Whether a path's components match a glob's, as the shell's: each wildcard within one
    component (``*`` never crosses a ``/``), ``**`` as any number of whole components."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_matches(parts[i:], rest) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _matches(parts[1:], rest)


def _metadata(filesystem: pafs.FileSystem, path: str) -> Any:
    import pyarrow.parquet as pq

    with filesystem.open_input_file(path) as f:
        return pq.ParquetFile(f).metadata


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
