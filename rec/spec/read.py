"""Spec files -> a validated ``Spec``; one reader per format, each bounded and strict.

Parquet and Arrow files are validated column by column (``rec.spec.columnar``); the other formats,
and typed files with any problem, row by row (``rec.spec.validate``), which names every problem.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rec.documents import DocumentError, load_json, load_yaml
from rec.errors import InputError, Problem
from rec.input_files import MAX_SPEC_FILE_BYTES, decode_utf8, read_bytes
from rec.spec.columnar import spec_from_arrow
from rec.spec.columns import COLUMNS
from rec.spec.limits import MAX_TABLES, too_many_tables
from rec.spec.types import Spec
from rec.spec.validate import spec_from_rows
from rec.units import format_bytes

FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
    ".csv": "csv",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
}
WHAT = "spec"
_DISPLAY = {"parquet": "Parquet", "arrow": "Arrow", "csv": "CSV", "yaml": "YAML", "json": "JSON"}


def read_spec(path: str | Path) -> Spec:
    """Read and validate a spec file (Parquet, Arrow IPC/Feather, CSV, YAML or JSON)."""
    path = Path(path)
    kind = spec_format(path)
    content = _read(path, kind)
    if isinstance(content, list):
        return spec_from_rows(content, source=str(path))
    return spec_from_arrow(content, source=str(path))


def spec_format(path: str | Path) -> str:
    """The format named by ``path``'s extension; InputError for an extension we do not read."""
    kind = FORMATS.get(Path(path).suffix.lower())
    if kind is None:
        known = ", ".join(sorted(FORMATS))
        reason = ("is a directory, not a spec file" if Path(path).is_dir()
                  else f"unsupported extension (use one of {known})")
        raise InputError(f"Unsupported spec file {path}", [Problem(str(path), reason)])
    return kind


def _read(path: Path, kind: str) -> Any:
    """A list of rows (YAML, JSON) or a pyarrow Table (the other formats)."""
    data = read_bytes(path, WHAT, MAX_SPEC_FILE_BYTES)
    if not data or data.isspace():
        raise InputError(f"Invalid spec {path}", [Problem(str(path), "the file is empty: the spec has no tables")])
    try:
        content = _READERS[kind](data, path)
    except (InputError, MemoryError):
        raise
    except DocumentError as e:
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), str(e))]) from None
    except Exception as e:  # pyarrow raises its own types for a malformed file
        reason = f"not valid {_DISPLAY[kind]}: {_first_line(e)}"
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), reason)]) from None
    if not isinstance(content, list):
        _check_arrow_table(content, path)
    return content


def _read_parquet(data: bytes, path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # ParquetFile, not read_table: read_table imports pyarrow.dataset and pandas (0.4 s).
    file = pq.ParquetFile(pa.BufferReader(data))
    meta = file.metadata
    _check_count(meta.num_rows, path)
    unpacked = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if unpacked > MAX_SPEC_FILE_BYTES:  # a small file can decompress to gigabytes
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), _too_big_unpacked(unpacked))])
    return file.read()


def _read_arrow(data: bytes, path: Path) -> Any:
    import pyarrow as pa

    try:
        reader = pa.ipc.open_file(pa.BufferReader(data))
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:  # not the IPC file format: an IPC stream, or Feather v1
        try:
            reader = pa.ipc.open_stream(pa.BufferReader(data))
            batches = iter(reader)
        except pa.ArrowInvalid:
            import pyarrow.feather as feather

            return feather.read_table(pa.BufferReader(data))
    kept, size = [], 0
    for batch in batches:  # one at a time: compressed batches can unpack to gigabytes
        size += batch.nbytes
        if size > MAX_SPEC_FILE_BYTES:
            raise InputError(f"Cannot read spec {path}", [Problem(str(path), _too_big_unpacked(size))])
        kept.append(batch)
    return pa.Table.from_batches(kept, schema=reader.schema)


def _read_csv(data: bytes, path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.csv as csv

    decode_utf8(data, path, WHAT)  # names the first bad byte; pyarrow would only say "invalid UTF8"
    # Every known column as text: the validator parses it, so "abc" or "1.5" gets a clear message.
    # Only an empty cell is missing: pyarrow would also read "NaN", "NA" or "null" as a missing value.
    options = csv.ConvertOptions(column_types={c: pa.string() for c in COLUMNS}, strings_can_be_null=True,
                                 null_values=[""])
    return csv.read_csv(io.BytesIO(data), convert_options=options)


def _read_yaml(data: bytes, path: Path) -> list[object]:
    return _rows_of(load_yaml(decode_utf8(data, path, WHAT)), path)


def _read_json(data: bytes, path: Path) -> list[object]:
    return _rows_of(load_json(decode_utf8(data, path, WHAT)), path)


def _rows_of(document: object, path: Path) -> list[object]:
    """A YAML/JSON spec is a list of table mappings, or a mapping whose only key is ``tables``."""
    if isinstance(document, dict) and set(document) == {"tables"}:
        document = document["tables"]
    elif isinstance(document, dict):
        extra = ", ".join(sorted(str(k) for k in set(document) - {"tables"}))
        reason = (f"unknown top-level keys: {extra}" if "tables" in document
                  else "expected a list of tables or a 'tables:' key")
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), reason)])
    if document is None:
        return []
    if not isinstance(document, list):
        reason = f"expected a list of tables or a 'tables:' key, got {type(document).__name__}"
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), reason)])
    _check_count(len(document), path)
    return document


def _check_arrow_table(table: Any, path: Path) -> None:
    """Columns named twice would silently lose one of them in a row; too many rows fill memory."""
    _check_count(table.num_rows, path)
    twice = sorted(str(n) for n, k in Counter(table.column_names).items() if k > 1)
    if twice:
        problems = [Problem(f"column {n!r}", "appears more than once in the file") for n in twice]
        raise InputError(f"Invalid spec {path}", problems)
    size = sum(_unpacked_bytes(column) for column in table.columns)
    if size > MAX_SPEC_FILE_BYTES:
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), _too_big_unpacked(size))])


def _unpacked_bytes(column: Any) -> int:
    """Bytes of a column once each cell is its own value: a dictionary stores a repeated one once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(column.type):
        return int(column.nbytes)
    total = 0
    for chunk in column.chunks:
        values = chunk.dictionary
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type) or \
                pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
            lengths = pc.binary_length(values)
        else:
            lengths = pa.array([values.nbytes // max(len(values), 1)] * len(values), pa.int64())
        total += (pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0) + chunk.indices.nbytes
    return total


def _too_big_unpacked(size: int) -> str:
    return (f"holds {format_bytes(size)} of data once unpacked, more than the "
            f"{format_bytes(MAX_SPEC_FILE_BYTES)} shardflow reads for a spec (is this the right file?)")


def _check_count(count: int, path: Path) -> None:
    if count > MAX_TABLES:
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), too_many_tables(count))])


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return " ".join(text.splitlines()[:3])


_READERS: dict[str, Callable[[bytes, Path], Any]] = {
    "parquet": _read_parquet,
    "arrow": _read_arrow,
    "csv": _read_csv,
    "yaml": _read_yaml,
    "json": _read_json,
}
