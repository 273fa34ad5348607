"""Table specs: read any supported file, validate every row, hash the content."""

from __future__ import annotations

from rec.spec.read import read_spec
from rec.spec.types import Spec, TableSpec
from rec.spec.validate import spec_from_rows
from rec.spec.write import write_spec

__all__ = ["Spec", "TableSpec", "read_spec", "spec_from_rows", "write_spec"]
