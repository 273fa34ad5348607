"""The spec's column contract (docs/spec.md): names, which are required, and a table as a plain row."""

from __future__ import annotations

from enum import Enum

from rec.sharding import ComputeKernel, DataType, Pooling, ShardingType
from rec.spec.types import DEFAULT_MODULE, TableSpec

REQUIRED = ("name", "num_embeddings", "embedding_dim")
# Statistics measured from training data (``shardflow spec stats``): the planner does not read them.
STATS_COLUMNS = ("stats_rows", "stats_batch_size", "distinct_per_batch", "ids_out_of_range", "hit_rate_curve")
OPTIONAL = ("feature_names", "pooling", "data_type", "pooling_factor", "sharding_types", "compute_kernels",
            "module", "min_partition", "cache_load_factor", "is_weighted", *STATS_COLUMNS,
            "min_cache_load_factor", "optimizer")
# Written only where a table sets them, so rows (and hashes) of specs without them stay what they were.
SPARSE_COLUMNS = ("module", "min_partition", "cache_load_factor", "is_weighted", *STATS_COLUMNS,
                  "min_cache_load_factor", "optimizer")
COLUMNS = REQUIRED + OPTIONAL
LIST_COLUMNS = ("feature_names", "sharding_types", "compute_kernels")
LIST_SEPARATOR = ";"  # how list cells are written in CSV
# A hit-rate curve's points: (cache_fraction, hit_rate) pairs; Parquet/Arrow hold them as a list of
# structs with these fields, YAML/JSON as a list of pairs, CSV as ``0.01:0.42;0.1:0.75``.
CURVE_FIELDS = ("cache_fraction", "hit_rate")
PAIR_SEPARATOR = ":"


def table_to_row(table: TableSpec) -> dict[str, object]:
    """Every column of ``table`` as plain JSON values (enums as their values, tuples as lists);
    ``module`` only when it is not ``DEFAULT_MODULE``, ``is_weighted`` only when true, ``min_partition``,
    ``cache_load_factor``, ``min_cache_load_factor``, ``optimizer`` and the ``STATS_COLUMNS`` only when set, so rows
    (and hashes) of specs without them stay what they were; the curve as ``[[cache_fraction, hit_rate], ...]``."""
    row: dict[str, object] = {
        "name": table.name,
        "num_embeddings": table.num_embeddings,
        "embedding_dim": table.embedding_dim,
        "feature_names": list(table.feature_names),
        "pooling": VALUE[table.pooling],
        "data_type": VALUE[table.data_type],
        "pooling_factor": float(table.pooling_factor),
        "sharding_types": _values(table.sharding_types),
        "compute_kernels": _values(table.compute_kernels),
    }
    if table.module != DEFAULT_MODULE:
        row["module"] = table.module
    if table.min_partition is not None:
        row["min_partition"] = table.min_partition
    if table.cache_load_factor is not None:
        row["cache_load_factor"] = float(table.cache_load_factor)
    if table.min_cache_load_factor is not None:
        row["min_cache_load_factor"] = float(table.min_cache_load_factor)
    if table.optimizer is not None:
        row["optimizer"] = table.optimizer.value
    if table.is_weighted:
        row["is_weighted"] = True
    for column in STATS_COLUMNS:
        value = getattr(table, column)
        if value is not None:
            row[column] = [list(point) for point in value] if column == "hit_rate_curve" else value
    return row


def table_to_short_row(table: TableSpec) -> dict[str, object]:
    """Like ``table_to_row`` but without the columns that hold their default."""
    row = table_to_row(table)
    defaults = {
        "feature_names": [table.name],
        "pooling": Pooling.SUM.value,
        "data_type": DataType.FP32.value,
        "pooling_factor": 1.0,
        "sharding_types": None,
        "compute_kernels": None,
    }
    return {k: v for k, v in row.items() if k not in defaults or v != defaults[k]}


def _values(members: tuple[Enum, ...] | None) -> list[str] | None:
    return None if members is None else [VALUE[m] for m in members]


# Enum .value is a descriptor call: a spec hash reads it 200,000 times for 100,000 tables.
VALUE: dict[Enum, str] = {m: m.value for enum in (Pooling, DataType, ShardingType, ComputeKernel) for m in enum}
