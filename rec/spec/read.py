"""Spec files -> raw row dicts, one reader per format; ``read_spec`` then validates them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from rec.errors import InputError, Problem
from rec.spec.columns import COLUMNS
from rec.spec.types import Spec
from rec.spec.validate import spec_from_rows

YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's is ~10x faster on big specs
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


def read_spec(path: str | Path) -> Spec:
    """Read and validate a spec file (Parquet, Arrow IPC/Feather, CSV, YAML or JSON)."""
    return spec_from_rows(read_rows(path), source=str(path))


def read_rows(path: str | Path) -> list:
    """The spec file's rows as they are written, unvalidated; InputError if it cannot be read."""
    path = Path(path)
    kind = spec_format(path)
    if not path.is_file():
        reason = "is a directory, not a file" if path.is_dir() else "no such file"
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), reason)])
    try:
        return _READERS[kind](path)
    except InputError:
        raise
    except OSError as e:
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), e.strerror or str(e))]) from e
    except Exception as e:  # pyarrow, yaml and json each raise their own types for a malformed file
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), f"not valid {kind}: {_first_line(e)}")]) from e


def spec_format(path: str | Path) -> str:
    """The format named by ``path``'s extension; InputError for an extension we do not read."""
    kind = FORMATS.get(Path(path).suffix.lower())
    if kind is None:
        known = ", ".join(sorted(FORMATS))
        raise InputError(f"Unsupported spec file {path}", [Problem(str(path), f"unsupported extension (use one of {known})")])
    return kind


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    # ParquetFile, not read_table: read_table imports pyarrow.dataset and pandas (0.4 s).
    return pq.ParquetFile(path).read().to_pylist()


def _read_arrow(path: Path) -> list[dict]:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_file(source).read_all().to_pylist()
        except pa.ArrowInvalid:  # not the file format: an IPC stream, or Feather v1
            pass
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_stream(source).read_all().to_pylist()
        except pa.ArrowInvalid:
            pass
    import pyarrow.feather as feather

    return feather.read_table(str(path)).to_pylist()


def _read_csv(path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.csv as csv

    # Every known column as text: the validator parses it, so "abc" or "1.5" gets a clear message.
    options = csv.ConvertOptions(column_types={c: pa.string() for c in COLUMNS}, strings_can_be_null=True)
    return csv.read_csv(path, convert_options=options).to_pylist()


def _read_yaml(path: Path) -> list:
    return _rows_of(yaml.load(path.read_text(encoding="utf-8"), Loader=YAML_LOADER), path)


def _read_json(path: Path) -> list:
    return _rows_of(json.loads(path.read_text(encoding="utf-8")), path)


def _rows_of(document: object, path: Path) -> list:
    """A YAML/JSON spec is a list of table mappings, or a mapping whose only key is ``tables``."""
    if isinstance(document, dict) and set(document) == {"tables"}:
        document = document["tables"]
    elif isinstance(document, dict):
        extra = ", ".join(sorted(str(k) for k in set(document) - {"tables"}))
        reason = f"unknown top-level keys: {extra}" if "tables" in document else "expected a list of tables or a 'tables:' key"
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), reason)])
    if document is None:
        return []
    if not isinstance(document, list):
        reason = f"expected a list of tables or a 'tables:' key, got {type(document).__name__}"
        raise InputError(f"Cannot read spec {path}", [Problem(str(path), reason)])
    return document


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return " ".join(text.splitlines()[:3])


_READERS: dict[str, Callable[[Path], list]] = {
    "parquet": _read_parquet,
    "arrow": _read_arrow,
    "csv": _read_csv,
    "yaml": _read_yaml,
    "json": _read_json,
}
