"""``spec_hash``: same tables, same hash, whatever the file format or row order."""

from __future__ import annotations

from collections.abc import Iterable

from rec.hashing import content_hash
from rec.spec.columns import table_to_row
from rec.spec.types import TableSpec

SPEC_HASH_FORMAT = "shardflow.spec/v1"


def spec_hash(tables: Iterable[TableSpec]) -> str:
    """16 hex digits of sha256 over the validated tables, sorted by name, as canonical JSON."""
    rows = sorted((table_to_row(t) for t in tables), key=lambda row: row["name"])
    return content_hash({"format": SPEC_HASH_FORMAT, "tables": rows})
