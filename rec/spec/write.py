"""``write_spec``: a Spec to any format ``read_spec`` reads, chosen by the file extension."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rec.disk_full import whole
from rec.errors import InputError, Problem
from rec.spec.columns import (
    COLUMNS,
    CURVE_FIELDS,
    LIST_COLUMNS,
    LIST_SEPARATOR,
    PAIR_SEPARATOR,
    SPARSE_COLUMNS,
    table_to_row,
    table_to_short_row,
)
from rec.spec.read import spec_format
from rec.spec.types import Spec


def write_spec(spec: Spec, path: str | Path) -> Path:
    """Write ``spec`` to ``path`` in the format its extension names, whole: beside it, then renamed
    over, so that a failed write leaves what was there (a cut YAML spec can read as a valid smaller
    one); ``DiskFull`` naming ``path`` on a full disk. Returns the path."""
    path = Path(path)
    kind = spec_format(path)
    with whole(path) as into:
        if kind == "yaml":
            rows = [table_to_short_row(t) for t in spec.tables]
            into.write_text(yaml.dump({"tables": rows}, Dumper=_SpecDumper, sort_keys=False), encoding="utf-8")
        elif kind == "json":
            rows = [table_to_short_row(t) for t in spec.tables]
            into.write_text(json.dumps({"tables": rows}, indent=1) + "\n", encoding="utf-8")
        else:
            _write_tabular(spec, path, kind, into)
    return path


def _write_tabular(spec: Spec, path: Path, kind: str, into: Path) -> None:
    """``spec`` as ``kind`` into the file ``into``, which becomes ``path``."""
    import pyarrow as pa

    rows = [table_to_row(t) for t in spec.tables]
    # The module, min_partition, cache load factor, is_weighted and statistics columns only where a table has
    # one: other specs are written as before.
    present = {c for row in rows for c in SPARSE_COLUMNS if c in row}
    columns = tuple(c for c in COLUMNS if c not in SPARSE_COLUMNS or c in present)
    if kind == "csv":
        import pyarrow.csv as csv

        split = [Problem(f"table {t.key}", f"feature name {f!r} holds {LIST_SEPARATOR!r}, CSV's list separator: it "
                                           "would read back as several features; write .yaml, .json or .parquet")
                 for t in spec.tables for f in t.feature_names if LIST_SEPARATOR in f]
        if split:
            raise InputError(f"Cannot write {path} as CSV:", split)
        for row, t in zip(rows, spec.tables, strict=True):
            for column in LIST_COLUMNS:
                items = row[column]
                if isinstance(items, list):
                    row[column] = LIST_SEPARATOR.join(items)
            if t.hit_rate_curve is not None:
                row["hit_rate_curve"] = LIST_SEPARATOR.join(
                    f"{fraction!r}{PAIR_SEPARATOR}{rate!r}" for fraction, rate in t.hit_rate_curve)
        schema = _schema(columns, list_type=pa.string(), curve_type=pa.string())
        csv.write_csv(pa.Table.from_pylist(rows, schema=schema), into)
        return
    for row, t in zip(rows, spec.tables, strict=True):
        if t.hit_rate_curve is not None:
            row["hit_rate_curve"] = [dict(zip(CURVE_FIELDS, point, strict=True)) for point in t.hit_rate_curve]
    curve_type = pa.list_(pa.struct([(field, pa.float64()) for field in CURVE_FIELDS]))
    table = pa.Table.from_pylist(rows, schema=_schema(columns, list_type=pa.list_(pa.string()), curve_type=curve_type))
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, into)
    else:
        import pyarrow.feather as feather

        feather.write_feather(table, into)


def _schema(columns: tuple[str, ...], list_type: Any, curve_type: Any) -> Any:
    import pyarrow as pa

    types = {"num_embeddings": pa.int64(), "embedding_dim": pa.int64(), "pooling_factor": pa.float64(),
             "min_partition": pa.int64(), "cache_load_factor": pa.float64(), "min_cache_load_factor": pa.float64(),
             "is_weighted": pa.bool_(),
             "stats_rows": pa.int64(), "stats_batch_size": pa.int64(),
             "distinct_per_batch": pa.float64(), "ids_out_of_range": pa.int64(), "hit_rate_curve": curve_type}
    return pa.schema([(c, list_type if c in LIST_COLUMNS else types.get(c, pa.string())) for c in columns])


_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's when built


class _SpecDumper(_DUMPER):  # type: ignore[valid-type,misc]
    """Writes short lists inline (``feature_names: [cat_0]``) so one table stays a few lines."""


def _represent_list(dumper: _SpecDumper, data: list[object]) -> yaml.Node:
    flow = all(not isinstance(item, (list, dict)) for item in data)
    node: yaml.Node = dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)
    return node


_SpecDumper.add_representer(list, _represent_list)
