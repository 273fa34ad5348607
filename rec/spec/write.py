"""``write_spec``: a Spec to any format ``read_spec`` reads, chosen by the file extension."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rec.spec.columns import COLUMNS, LIST_COLUMNS, LIST_SEPARATOR, SPARSE_COLUMNS, table_to_row, table_to_short_row
from rec.spec.read import spec_format
from rec.spec.types import Spec


def write_spec(spec: Spec, path: str | Path) -> Path:
    """Write ``spec`` to ``path`` in the format its extension names; returns the path."""
    path = Path(path)
    kind = spec_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "yaml":
        rows = [table_to_short_row(t) for t in spec.tables]
        path.write_text(yaml.dump({"tables": rows}, Dumper=_SpecDumper, sort_keys=False), encoding="utf-8")
    elif kind == "json":
        rows = [table_to_short_row(t) for t in spec.tables]
        path.write_text(json.dumps({"tables": rows}, indent=1) + "\n", encoding="utf-8")
    else:
        _write_tabular(spec, path, kind)
    return path


def _write_tabular(spec: Spec, path: Path, kind: str) -> None:
    import pyarrow as pa

    rows = [table_to_row(t) for t in spec.tables]
    # The module and min_partition columns only where a table has one: other specs are written as before.
    present = {c for row in rows for c in SPARSE_COLUMNS if c in row}
    columns = tuple(c for c in COLUMNS if c not in SPARSE_COLUMNS or c in present)
    if kind == "csv":
        import pyarrow.csv as csv

        for row in rows:
            for column in LIST_COLUMNS:
                items = row[column]
                if isinstance(items, list):
                    row[column] = LIST_SEPARATOR.join(items)
        csv.write_csv(pa.Table.from_pylist(rows, schema=_schema(columns, list_type=pa.string())), path)
        return
    table = pa.Table.from_pylist(rows, schema=_schema(columns, list_type=pa.list_(pa.string())))
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    else:
        import pyarrow.feather as feather

        feather.write_feather(table, path)


def _schema(columns: tuple[str, ...], list_type: Any) -> Any:
    import pyarrow as pa

    types = {"num_embeddings": pa.int64(), "embedding_dim": pa.int64(), "pooling_factor": pa.float64(),
             "min_partition": pa.int64()}
    return pa.schema([(c, list_type if c in LIST_COLUMNS else types.get(c, pa.string())) for c in columns])


_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's when built


class _SpecDumper(_DUMPER):  # type: ignore[valid-type,misc]
    """Writes short lists inline (``feature_names: [cat_0]``) so one table stays a few lines."""


def _represent_list(dumper: _SpecDumper, data: list[object]) -> yaml.Node:
    flow = all(not isinstance(item, (list, dict)) for item in data)
    node: yaml.Node = dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)
    return node


_SpecDumper.add_representer(list, _represent_list)
