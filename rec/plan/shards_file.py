"""``shards.parquet`` (and a replanned plan's ``movement.parquet``): one row per shard, written from
the plan's columns, and checked against the plan.json beside it when a plan directory is read
(docs/plan-format.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rec.errors import Problem
from rec.plan.metrics import Movement
from rec.plan.plan_json import KERNEL_VALUES, PLAN_FILE, SHARDING_VALUES
from rec.plan.types import Plan
from rec.spec.types import DEFAULT_MODULE

SHARDS_FILE = "shards.parquet"
MOVEMENT_FILE = "movement.parquet"  # replanned plans: bytes moving into and out of each rank
SHARD_COLUMNS = ("plan_id", "table", "sharding_type", "compute_kernel", "shard", "rank",
                 "row_offset", "col_offset", "rows", "cols")
# A plan with tables outside the default module (plan.json v3) also has a module column after table.
SHARD_COLUMNS_MODULES = (*SHARD_COLUMNS[:2], "module", *SHARD_COLUMNS[2:])
TEXT_COLUMNS = (*SHARD_COLUMNS[:4], "module")  # the rest are integers
ROWS_PER_GROUP = 1 << 22  # shards.parquet is written in row groups of at most this many shards


def missing_shards(path: str | Path) -> Problem:
    """The problem of a plan directory without its shards.parquet at ``path``."""
    return Problem(str(path), f"is missing (or not a file): a plan directory holds the {PLAN_FILE} and "
                              f"{SHARDS_FILE} of one plan; write the plan again")


def shards_problems(plan: Plan, path: str | Path, data: bytes | None = None) -> list[Problem]:
    """Why ``path`` (or ``data``, its bytes as read) is not the shards.parquet of ``plan`` (missing,
    truncated, of another plan, edited); empty when it lists exactly the plan's shards."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(path)
    where = str(path)
    plan = replace(plan, tables=plan.columns)  # columns once, for the count and the rows
    if data is None and not path.is_file():
        return [missing_shards(path)]
    expected = int(np.where(plan.columns.replicated, plan.world_size, np.diff(plan.columns.shard_start)).sum())
    try:
        f = pq.ParquetFile(path if data is None else pa.BufferReader(data))
        names = f.schema_arrow.names
        columns = shard_columns(plan)
        if names != list(columns):
            return [Problem(where, f"has the columns {', '.join(names[:12])}, not those of a {SHARDS_FILE} "
                                   f"({', '.join(columns)})")]
        kinds = [_is_text(t) if name in TEXT_COLUMNS else pa.types.is_integer(t)
                 for name, t in zip(names, f.schema_arrow.types, strict=True)]
        if not all(kinds):
            found = ", ".join(f"{n} {t}" for n, t in zip(names, f.schema_arrow.types, strict=True))
            return [Problem(where, f"has columns of other types ({found}): text for {', '.join(TEXT_COLUMNS)}, "
                                   "integers for the rest")]
        ids = [str(v) for v in pc.unique(f.read(columns=["plan_id"])["plan_id"]).to_pylist()]
        if ids != [plan.plan_id]:
            return [Problem(where, f"belongs to plan {', '.join(ids[:3]) or '(none)'}, not to plan {plan.plan_id} "
                                   f"of its {PLAN_FILE}; write the plan again")]
        if f.metadata.num_rows != expected:
            return [Problem(where, f"has {f.metadata.num_rows:,} rows, but plan {plan.plan_id} has {expected:,} "
                                   "shards: truncated or edited; write the plan again")]
        table = f.read()
        # Text as another writer may store it (large_string, dictionary-encoded: pandas, Spark) is the same text.
        table = pa.table([c.cast(pa.string()) if name in TEXT_COLUMNS else c
                          for name, c in zip(table.column_names, table.columns, strict=True)], names=table.column_names)
        offset = 0
        for batch in shard_tables(plan):
            want = batch.cast(table.schema)
            if not table.slice(offset, len(want)).equals(want):
                return [Problem(where, f"does not list the shards of its {PLAN_FILE} (plan {plan.plan_id}): one of "
                                       "the two was edited; write the plan again")]
            offset += len(want)
    except (OSError, ValueError, pa.ArrowException):  # pyarrow's own words say no more than this
        return [Problem(where, "is not a readable Parquet file (truncated or corrupt); write the plan again")]
    return []


def _is_text(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or (pa.types.is_dictionary(t) and _is_text(t.value_type)))


def shard_columns(plan: Plan) -> tuple[str, ...]:
    """shards.parquet's columns for ``plan``: with ``module`` where a table is outside the default module."""
    return SHARD_COLUMNS if all(m == DEFAULT_MODULE for m in plan.columns.modules) else SHARD_COLUMNS_MODULES


def shard_tables(plan: Plan, rows_per_group: int = ROWS_PER_GROUP) -> Iterator[Any]:
    """``shards.parquet``'s rows as Arrow tables of at most ``rows_per_group`` shards (more for
    one table with more shards): one row per shard, replicas expanded, in table and shard order."""
    import pyarrow as pa

    c = plan.columns
    n = len(c)
    replicated = c.replicated
    counts = np.where(replicated, plan.world_size, np.diff(c.shard_start))
    flat = np.stack([c.rank, c.row_offset, c.col_offset, c.rows, c.cols], axis=1)
    first = c.shard_start[:-1]
    names = _strings(list(c.names))
    columns = shard_columns(plan)
    modules = _strings(list(c.modules)) if "module" in columns else None
    st_values = _strings(SHARDING_VALUES)
    ck_values = _strings(KERNEL_VALUES)
    st_code, ck_code = c.sharding_type.astype(np.int32), c.compute_kernel.astype(np.int32)
    plan_id = _strings([plan.plan_id])
    ends = np.cumsum(counts)
    start = 0
    while start < n or (n == 0 and start == 0):
        stop = max(int(np.searchsorted(ends, (ends[start - 1] if start else 0) + rows_per_group,
                                       side="right")), start + 1) if n else 0
        t = np.repeat(np.arange(start, stop), counts[start:stop])
        k = np.arange(len(t)) - np.repeat(ends[start:stop] - counts[start:stop], counts[start:stop]) \
            + (ends[start - 1] if start else 0)
        values = flat[first[t] + np.where(replicated[t], 0, k)]
        values[:, 0] = np.where(replicated[t], k, values[:, 0])  # replica k lives on rank k
        by_table = [pa.DictionaryArray.from_arrays(_ints(t.astype(np.int32)), names)]
        if modules is not None:
            by_table.append(pa.DictionaryArray.from_arrays(_ints(t.astype(np.int32)), modules))
        yield pa.Table.from_arrays([
            pa.DictionaryArray.from_arrays(_ints(np.zeros(len(t), np.int32)), plan_id),
            *by_table,
            pa.DictionaryArray.from_arrays(_ints(st_code[t]), st_values),
            pa.DictionaryArray.from_arrays(_ints(ck_code[t]), ck_values),
            _ints(k), *(_ints(values[:, j]) for j in range(5)),
        ], names=list(columns))
        if n == 0:
            return
        start = stop


def write_shards(plan: Plan, path: Path) -> None:
    """``shards.parquet`` of ``plan`` at ``path`` (zstd, row groups of ``ROWS_PER_GROUP`` shards)."""
    import pyarrow.parquet as pq

    writer: Any = None
    try:
        for table in shard_tables(plan):
            # store_schema=False: readers see plain string columns, as shardflow always wrote them.
            writer = writer or pq.ParquetWriter(path, table.schema, compression="zstd",
                                                write_statistics=False, store_schema=False)
            writer.write_table(table)
        if writer is not None:
            closing, writer = writer, None
            closing.close()
    finally:
        if writer is not None:  # a write failed: that error is the one to report, not the close's
            try:
                writer.close()
            except OSError:
                pass


def write_movement(movement: Movement, path: Path) -> None:
    """One row per rank: ``rank``, ``bytes_in``, ``bytes_out`` (moved parameter + optimizer bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    incoming = np.asarray(movement.bytes_in, np.int64)
    table = pa.Table.from_arrays([_ints(np.arange(len(incoming), dtype=np.int64)), _ints(incoming),
                                  _ints(np.asarray(movement.bytes_out, np.int64))],
                                 names=["rank", "bytes_in", "bytes_out"])
    pq.write_table(table, path, compression="zstd", store_schema=False)



# Arrow arrays from raw buffers: ``pa.array`` would import pandas (0.3 s) just to check whether its
# argument is a pandas object, which would dominate planning 500 tables.


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(values), buffers)


def _ints(values: np.ndarray) -> Any:
    import pyarrow as pa

    wide = values.dtype != np.int32
    values = np.ascontiguousarray(values, dtype=np.int64 if wide else np.int32)
    kind = pa.int64() if wide else pa.int32()
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])
