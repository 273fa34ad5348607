"""A pyarrow Table (Parquet, Arrow) -> a validated ``Spec``, column by column.

The common case (typed columns, every cell valid) is checked with pyarrow and numpy in a fraction of
the time the row-by-row validator takes. Each check here is a sufficient condition for the row
validator's rules (``rec.spec.validate``), and cells are parsed by the same functions, so a spec
accepted here is exactly the ``Spec`` the row validator builds. Anything unusual, such as a float
row count, a blank-padded name or any invalid cell, goes to the row validator, which names every
problem.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rec.sharding import DataType, Pooling
from rec.spec.columns import COLUMNS, CURVE_FIELDS, REQUIRED, STATS_COLUMNS
from rec.spec.hashing import spec_hash
from rec.spec.limits import (
    DIM_MULTIPLE,
    MAX_EMBEDDING_DIM,
    MAX_NAME_LENGTH,
    MAX_TABLE_WEIGHTS,
    dense_only,
    is_reserved,
    spec_problems,
)
from rec.spec.types import DEFAULT_MODULE, Spec, TableSpec
from rec.spec.validate import CELL_PARSERS, MAX_COUNT, is_missing, module_problems, raise_problems, spec_from_rows

# RE2 (pyarrow) forms of the row validator's rules, for ASCII text: a table name, and a feature
# name that is printable with no blank at either end (so Python's strip() leaves it as it is).
_NAME_RE = "^[A-Za-z0-9_][A-Za-z0-9_-]*$"
_FEATURE_RE = "^[\\x21-\\x7e]([\\x20-\\x7e]*[\\x21-\\x7e])?$"


class _Decline(Exception):
    """The fast path cannot vouch for this table: validate it row by row."""


def spec_from_arrow(table: Any, source: str = "") -> Spec:
    """Validate a pyarrow Table of spec rows into a ``Spec``; InputError with every problem otherwise."""
    table = _plain_numbers(table)
    spec = columnar_spec(table, source)
    return spec if spec is not None else spec_from_rows(table.to_pylist(), source=source)


def _plain_numbers(table: Any) -> Any:
    """``table`` with its decimal columns (a warehouse's NUMERIC, Spark's DecimalType) as the numbers
    they hold: int64 at scale 0 where they fit it, else float64, so that the validator reads them as
    it reads any other number (a spec's cells are counts, sizes and rates)."""
    import pyarrow as pa

    for i, field in enumerate(table.schema):
        if not pa.types.is_decimal(field.type):
            continue
        column = table.column(i)
        try:
            plain = column.cast(pa.int64() if field.type.scale == 0 else pa.float64())
        except pa.ArrowInvalid:  # beyond int64: the validator names the value as too large
            plain = column.cast(pa.float64())
        table = table.set_column(i, field.name, plain)
    return table


def columnar_spec(table: Any, source: str = "") -> Spec | None:
    """The ``Spec`` if every cell is valid and plainly typed; None if the row validator must decide.

    InputError only for bounds on the whole spec (``rec.spec.limits.spec_problems``), as the row
    validator would raise them.
    """
    try:
        return _columnar(table, source)
    except _Decline:
        return None


def _columnar(table: Any, source: str) -> Spec:
    names = table.column_names
    n = table.num_rows
    if not n or len(set(names)) != len(names) or not set(REQUIRED) <= set(names) <= set(COLUMNS):
        raise _Decline
    # rare: the rows' validator reads them
    if {"min_partition", "cache_load_factor", "min_cache_load_factor", "optimizer"} & set(names):
        raise _Decline
    columns = {name: table.column(name).combine_chunks() for name in names}
    modules = _cells(columns.get("module"), "module", DEFAULT_MODULE, n)
    one_module = all(m == DEFAULT_MODULE for m in modules)
    table_names = _names(columns["name"], n, unique=one_module)
    if not one_module and len(set(zip(modules, table_names, strict=True))) != n:
        raise _Decline
    rows = _ints(columns["num_embeddings"], MAX_TABLE_WEIGHTS)
    dims = _ints(columns["embedding_dim"], MAX_EMBEDDING_DIM)
    if np.any(rows > MAX_TABLE_WEIGHTS // dims):  # rows * dims > the bound, without overflow
        raise _Decline
    features = _features(columns.get("feature_names"), table_names, None if one_module else modules)
    pooling_factor = _pooling_factors(columns.get("pooling_factor"), n)
    pooling = _cells(columns.get("pooling"), "pooling", Pooling.SUM, n)
    data_type = _cells(columns.get("data_type"), "data_type", DataType.FP32, n)
    sharding_types = _cells(columns.get("sharding_types"), "sharding_types", None, n)
    compute_kernels = _cells(columns.get("compute_kernels"), "compute_kernels", None, n)
    for i in np.flatnonzero(dims % DIM_MULTIPLE):
        if not dense_only(sharding_types[i], compute_kernels[i]):
            raise _Decline

    stats = _stats(columns, n) if any(c in columns for c in STATS_COLUMNS) else ()
    weighted = _weighted(columns.get("is_weighted"), n)
    unpooled = np.fromiter((p is Pooling.NONE for p in pooling), bool, n)
    none = [None] * n  # min_partition, the cache load factors, optimizer: declined above
    tables = tuple(
        map(TableSpec, table_names, rows.tolist(), dims.tolist(), features, pooling, data_type,
            pooling_factor.tolist(), sharding_types, compute_kernels, modules, none,
            *(stats or (none,) * len(STATS_COLUMNS)), none, weighted.tolist())
    )
    if (not one_module or unpooled.any() or weighted.any()) and module_problems([vars(t) for t in tables]):
        raise _Decline
    feature_count = np.fromiter(map(len, features), np.int64, n)
    raise_problems(
        f"Invalid spec {source}".rstrip(),
        spec_problems(rows * dims, pooling_factor * feature_count,
                      dims * feature_count * np.where(unpooled, pooling_factor, 1.0)),
    )
    return Spec(tables=tables, spec_hash=spec_hash(tables))


def _names(column: Any, n: int, unique: bool) -> list[str]:
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) or column.null_count:
        raise _Decline
    ok = pc.all(pc.match_substring_regex(column, _NAME_RE)).as_py()
    if not ok or pc.max(pc.binary_length(column)).as_py() > MAX_NAME_LENGTH:
        raise _Decline
    if unique and pc.count_distinct(column).as_py() != n:
        raise _Decline
    names: list[str] = column.to_pylist()
    if any(map(is_reserved, names)):
        raise _Decline
    return names


def _ints(column: Any, limit: int) -> np.ndarray:
    import pyarrow as pa

    if not pa.types.is_integer(column.type) or column.null_count:
        raise _Decline
    values = _numpy(column)
    if values.min() <= 0 or values.max() > limit:
        raise _Decline
    return values.astype(np.int64)


def _pooling_factors(column: Any, n: int) -> np.ndarray:
    import pyarrow as pa

    if column is None:
        return np.ones(n)
    if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        raise _Decline
    values = _numpy(column.cast(pa.float64()))
    if column.null_count:
        values = np.where(_mask(column.is_valid()), values, 1.0)  # null: the default
    if not np.all(np.isfinite(values) & (values > 0)):  # NaN too
        raise _Decline
    return values


def _weighted(column: Any, n: int) -> np.ndarray:
    """``is_weighted`` of a boolean column (null: false); other types go to the row validator."""
    import pyarrow as pa

    if column is None:
        return np.zeros(n, bool)
    if not pa.types.is_boolean(column.type):
        raise _Decline
    values = _mask(column)
    return values & _mask(column.is_valid()) if column.null_count else values


def _numpy(array: Any) -> np.ndarray:
    """A numeric array's values as numpy (whatever sits under a null). pyarrow's ``to_numpy()``, and any
    ``pa.scalar`` (so compute functions given a Python number), would import pandas, which nothing else needs."""
    dtype = np.dtype(_NUMPY_TYPES.get(str(array.type), str(array.type)))
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _mask(booleans: Any) -> np.ndarray:
    import pyarrow as pa

    return _numpy(booleans.cast(pa.int8())).astype(bool)


_NUMPY_TYPES = {"double": "float64", "float": "float32", "halffloat": "float16"}


def _features(column: Any, table_names: list[str], modules: list[str] | None) -> list[tuple[str, ...]]:
    """Each table's feature names: the list as written, or its own name where the cell is null.
    Unique in the spec (``modules`` None: every table in the default module) or in each module."""
    import pyarrow as pa
    import pyarrow.compute as pc

    features: list[tuple[str, ...]]
    if column is None:
        features = [(name,) for name in table_names]
    else:
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            raise _Decline
        flat = column.values  # every list's items, those under null cells too
        if not (pa.types.is_string(flat.type) or pa.types.is_large_string(flat.type)) or flat.null_count:
            raise _Decline
        if len(flat) and not pc.all(pc.match_substring_regex(flat, _FEATURE_RE)).as_py():
            raise _Decline
        offsets = _numpy(column.offsets)  # into column.values, slicing included
        given = _mask(column.is_valid())
        if np.any(given & (offsets[1:] == offsets[:-1])):  # an empty list
            raise _Decline
        items = flat.to_pylist()
        bounds = offsets.tolist()
        features = [
            tuple(items[bounds[i]:bounds[i + 1]]) if valid else (name,)
            for i, (name, valid) in enumerate(zip(table_names, given.tolist(), strict=True))
        ]
    every: list[object] = [f for names in features for f in names]
    if modules is not None:
        every = [(m, f) for m, names in zip(modules, features, strict=True) for f in names]
    if len(set(every)) != len(every):  # a feature twice, in one table or across tables of a module
        raise _Decline
    return features


def _cells(column: Any, name: str, default: Any, n: int) -> list[Any]:
    """A column parsed by the row validator's cell parser, once per distinct cell value."""
    if column is None or column.null_count == n:
        return [default] * n
    parse = CELL_PARSERS[name]
    parsed: dict[object, Any] = {}
    out = []
    for value in column.to_pylist():
        key = tuple(value) if isinstance(value, list) else value
        try:
            out.append(parsed[key])
            continue
        except KeyError:
            pass
        except TypeError:  # an unhashable cell (a struct, a nested list)
            raise _Decline from None
        if is_missing(value):
            result = default
        else:
            try:
                result = parse(value)
            except ValueError:
                raise _Decline from None
        parsed[key] = result
        out.append(result)
    return out


def _stats(columns: dict[str, Any], n: int) -> tuple[list[Any], ...]:
    """The ``STATS_COLUMNS`` in ``TableSpec`` field order, None where a cell is null."""
    batch = _optional_ints(columns.get("stats_batch_size"), 1, n)
    distinct = _optional_floats(columns.get("distinct_per_batch"), n)
    if any(d is not None and b is None for d, b in zip(distinct, batch, strict=True)):
        raise _Decline  # the row validator names it
    return (_optional_ints(columns.get("stats_rows"), 1, n), batch, distinct,
            _optional_ints(columns.get("ids_out_of_range"), 0, n), _curves(columns.get("hit_rate_curve"), n))


def _optional_ints(column: Any, minimum: int, n: int) -> list[int | None]:
    import pyarrow as pa

    if column is None or column.null_count == n:
        return [None] * n
    if not pa.types.is_integer(column.type):
        raise _Decline
    values = _numpy(column)
    valid = _mask(column.is_valid())
    if values.dtype == np.uint64 and np.any(valid & (values > MAX_COUNT)):
        raise _Decline
    if np.any(valid & (values.astype(np.int64) < minimum)):
        raise _Decline
    return [v if ok else None for v, ok in zip(values.astype(np.int64).tolist(), valid.tolist(), strict=True)]


def _optional_floats(column: Any, n: int) -> list[float | None]:
    import pyarrow as pa

    if column is None or column.null_count == n:
        return [None] * n
    if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        raise _Decline
    values = _numpy(column.cast(pa.float64()))
    valid = _mask(column.is_valid())
    if not np.all(~valid | (np.isfinite(values) & (values >= 0))):
        raise _Decline
    return [v if ok else None for v, ok in zip(values.tolist(), valid.tolist(), strict=True)]


def _curves(column: Any, n: int) -> list[tuple[tuple[float, float], ...] | None]:
    """Hit-rate curves held as lists of structs (what ``write_spec`` writes) whose every point is valid."""
    import pyarrow as pa

    if column is None or column.null_count == n:
        return [None] * n
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(kind.value_type) \
            or sorted(f.name for f in kind.value_type) != sorted(CURVE_FIELDS):
        raise _Decline
    flat = column.values
    if flat.null_count:
        raise _Decline
    fields = {f.name: a for f, a in zip(kind.value_type, flat.flatten(), strict=True)}
    if any(a.null_count or not (pa.types.is_floating(a.type) or pa.types.is_integer(a.type)) for a in fields.values()):
        raise _Decline
    fraction, rate = (_numpy(fields[name].cast(pa.float64())) for name in CURVE_FIELDS)
    if not np.all((fraction > 0) & (fraction <= 1) & (rate >= 0) & (rate <= 1)):  # NaN too
        raise _Decline
    offsets = _numpy(column.offsets)
    valid = _mask(column.is_valid())
    if np.any(valid & (offsets[1:] == offsets[:-1])):  # an empty curve
        raise _Decline
    inner = np.ones(len(fraction), bool)  # a point with one before it in its curve
    inner[offsets[:-1][offsets[:-1] < len(fraction)]] = False
    inner[0:1] = False
    if np.any(inner[1:] & ((fraction[1:] <= fraction[:-1]) | (rate[1:] < rate[:-1]))):
        raise _Decline
    points = list(zip(fraction.tolist(), rate.tolist(), strict=True))
    bounds = offsets.tolist()
    return [tuple(points[bounds[i]:bounds[i + 1]]) if ok else None for i, ok in enumerate(valid.tolist())]
