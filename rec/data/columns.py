"""Rows of training data as numpy arrays, converted from Arrow without a Python object per row.

``Columns`` holds a run of samples: labels, the dense matrix, and per id slot (``DataLayout.slots``:
a feature column as tables of one size read it) its ids as one flat array with per-sample lengths,
the layout of a KeyedJaggedTensor's values and lengths; ids mapped under ``--ids modulo|hash``. The
slots of one column share its lengths. A weighted feature's slots also hold its weights (the column
``<feature>_weights``), float32, one per id, aligned with the ids: a KeyedJaggedTensor's weights.
``from_arrow`` checks every value on the way: a null or non-binary label, a dense list of the wrong
width, with nulls or with values not finite as float32, a null id, an id out of range under
``--ids error``, a weights column missing or of another type, a weights list that is null (for a
row with ids) or not as long as the row's ids, a null or non-finite weight: an ``InputError`` naming
the column, how many rows, and the first row where it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rec.data.ids import IdsPolicy, map_ids, out_of_range
from rec.data.layout import DENSE, LABEL, DataLayout, weights_column
from rec.errors import InputError, Problem
from rec.units import counted

if TYPE_CHECKING:
    import pyarrow as pa

Locate = Callable[[int], str]  # row index in the converted table -> "row R of FILE"
BAD_DATA = "The training data cannot be used:"


@dataclass(frozen=True)
class Wording:
    """How bad values are named: the error's title, and what to do about ids out of range."""

    title: str = BAD_DATA
    out_of_range: str = "map ids into range with --ids modulo or --ids hash"


TRAINING = Wording()
EVALUATION = Wording("The evaluation data cannot be used:")  # --eval-data
_TRAINED_IN_RANGE = "the model takes ids in range only (it was trained with --ids error): map them before "
# shardflow eval's --data, predict's: the ids policy is the model's, which no flag changes
CHECKPOINT_EVALUATION = Wording(EVALUATION.title, _TRAINED_IN_RANGE + "evaluating")
PREDICTION_INPUT = Wording("The data cannot be used:", _TRAINED_IN_RANGE + "predicting")


@dataclass(frozen=True)
class Columns:
    labels: np.ndarray  # float32 (n,)
    dense: np.ndarray  # float32 (n, dense_in_features)
    lengths: tuple[np.ndarray, ...]  # per slot (layout.slots): int32 (n,)
    offsets: tuple[np.ndarray, ...]  # per slot: int64 (n + 1,), from 0
    ids: tuple[np.ndarray, ...]  # per slot: int64, the ids of every row in order
    weights: tuple[np.ndarray | None, ...]  # per slot: float32, one per id (aligned with ids); None: unweighted

    def __len__(self) -> int:
        return len(self.labels)

    def weights_of(self, slot: int) -> np.ndarray:
        """The weights of a weighted slot."""
        weights = self.weights[slot]
        if weights is None:
            raise ValueError(f"slot {slot} is not weighted")
        return weights

    def slice(self, start: int, stop: int) -> Columns:
        """Rows ``[start, stop)``."""
        return Columns(self.labels[start:stop], self.dense[start:stop],
                       tuple(n[start:stop] for n in self.lengths),
                       tuple(o[start:stop + 1] - o[start] for o in self.offsets),
                       tuple(ids[o[start]:o[stop]] for ids, o in zip(self.ids, self.offsets, strict=True)),
                       tuple(None if w is None else w[o[start]:o[stop]]
                             for w, o in zip(self.weights, self.offsets, strict=True)))

    def take(self, rows: np.ndarray) -> Columns:
        """The rows ``rows`` (indices), in that order."""
        ones, counting = np.ones(len(rows), np.int32), np.arange(len(rows) + 1, dtype=np.int64)
        lengths, offsets, ids, weights = [], [], [], []
        for n, o, values, w in zip(self.lengths, self.offsets, self.ids, self.weights, strict=True):
            if len(values) == len(n) and (n == 1).all():  # one id per row (Criteo's features): one gather
                lengths.append(ones)
                offsets.append(counting)
                at = rows
            else:
                taken = n[rows]
                new = _offsets(taken)
                lengths.append(taken)
                offsets.append(new)
                at = np.repeat(o[rows] - new[:-1], taken) + np.arange(int(new[-1]), dtype=np.int64)
            ids.append(values[at])
            weights.append(None if w is None else w[at])
        return Columns(self.labels[rows], self.dense[rows], tuple(lengths), tuple(offsets), tuple(ids),
                       tuple(weights))


def concat(parts: Sequence[Columns]) -> Columns:
    """The rows of ``parts``, one after the other."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    lengths = tuple(np.concatenate([p.lengths[c] for p in parts]) for c in range(len(first.lengths)))
    return Columns(np.concatenate([p.labels for p in parts]), np.concatenate([p.dense for p in parts]),
                   lengths, tuple(_offsets(n) for n in lengths),
                   tuple(np.concatenate([p.ids[s] for p in parts]) for s in range(len(first.ids))),
                   tuple(None if first.weights[s] is None else np.concatenate([p.weights_of(s) for p in parts])
                         for s in range(len(first.weights))))


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def from_arrow_parts(parts: Sequence[tuple[pa.Table, Locate]], layout: DataLayout, policy: IdsPolicy,
                     what: str = "--data", wording: Wording = TRAINING) -> Columns:
    """``from_arrow`` of consecutive slices of rows, each with how to name its rows: slices of one
    schema are joined in Arrow and converted at once; files whose types differ, each of a type
    training reads (list<int32> and list<int64> ids, bool and float labels, nullability), are
    converted apart and joined after. InputError naming every problem of every slice."""
    import pyarrow as pa

    runs: list[list[tuple[pa.Table, Locate]]] = []
    for part in parts:
        if runs and runs[-1][0][0].schema.equals(part[0].schema):
            runs[-1].append(part)
        else:
            runs.append([part])
    converted: list[Columns] = []
    problems: list[Problem] = []
    for run in runs:
        starts = np.cumsum([0] + [len(t) for t, _ in run])

        def locate(row: int, run: list[tuple[pa.Table, Locate]] = run, starts: np.ndarray = starts) -> str:
            i = int(np.searchsorted(starts, row, side="right")) - 1
            return run[i][1](row - int(starts[i]))

        table = pa.concat_tables([t for t, _ in run]) if len(run) > 1 else run[0][0]
        try:
            converted.append(from_arrow(table, layout, policy, locate, what, wording))
        except InputError as e:  # a column named by an earlier slice is not named again; several kinds in one are
            named = {q.where for q in problems}
            problems += [p for p in e.problems if p.where not in named]
    if problems:
        raise InputError(wording.title, problems)
    return concat(converted)


def from_arrow(table: pa.Table, layout: DataLayout, policy: IdsPolicy, locate: Locate,
               what: str = "--data", wording: Wording = TRAINING) -> Columns:
    """``table``'s rows as ``Columns``; InputError naming every column with a value training cannot use."""
    problems: list[Problem] = []
    labels = (_labels(table.column(LABEL), locate, what, problems) if layout.labelled
              else np.zeros(len(table), np.float32))
    dense = _dense(table.column(DENSE), layout.dense_in_features, locate, what, problems)
    lengths, offsets, values = [], [], []
    weights: dict[str, np.ndarray] = {}
    weighted = set(layout.weighted_columns)
    for name in layout.id_columns:
        before = len(problems)
        n, o, v = read_ids(table.column(name), name, locate, what, problems)
        lengths.append(n)
        offsets.append(o)
        values.append(v)
        if name in weighted:  # read once, whichever slots (tables of several sizes) read the ids
            weights[name] = read_weights(table, name, n if len(problems) == before else None, locate, what, problems)
    at = [layout.id_columns.index(s.column) for s in layout.slots]
    ids = []
    for slot, c in zip(layout.slots, at, strict=True):
        v = values[c]
        if policy is IdsPolicy.ERROR:
            bad = out_of_range(v, slot.rows)
            if bad.any():
                first = int(np.argmax(bad))
                row = int(np.searchsorted(offsets[c], first, side="right")) - 1
                unsigned = _unsigned_ids(table.column(slot.column).type)
                shown = int(v[first:first + 1].view(np.uint64)[0]) if unsigned else int(v[first])
                problems.append(Problem(
                    f"{what} column {slot.column!r}",
                    f"{counted(int(bad.sum()), 'id')} outside [0, {slot.rows:,}) ({_tables(slot.tables)}) in "
                    f"{len(table):,} rows read, first {shown} at {locate(row)}; {wording.out_of_range}"))
            ids.append(v)
        else:
            ids.append(map_ids(v, slot.rows, policy))
    if problems:
        raise InputError(wording.title, problems)
    return Columns(labels, dense, tuple(lengths[c] for c in at), tuple(offsets[c] for c in at), tuple(ids),
                   tuple(weights[s.column] if s.weighted else None for s in layout.slots))


def _unsigned_ids(kind: pa.DataType) -> bool:
    """Whether a column of ids holds uint64 (read as int64 with the same bits)."""
    import pyarrow as pa

    return bool((pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_uint64(kind.value_type))


def _tables(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"the rows of table{'s' if len(names) > 1 else ''} {shown}"


def _chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def type_problem(name: str, kind: pa.DataType, width: int, weights: bool = False) -> str | None:
    """What is wrong with column ``name`` being of type ``kind`` (label, dense of ``width``, a
    feature's ids, or with ``weights`` a weighted feature's weights); None when it is a type training
    reads."""
    import pyarrow as pa

    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if weights:
        if listed and (pa.types.is_floating(kind.value_type) or pa.types.is_integer(kind.value_type)):
            return None
        hint = "; store a row's weights as a list, as its ids" if pa.types.is_floating(kind) else ""
        return f"is {kind}; a weighted feature's weights are list<float32> (or list<float64>), one per id{hint}"
    if name == LABEL:
        numeric = (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
                   or pa.types.is_decimal(kind))  # a warehouse's NUMERIC
        return None if numeric else f"is {kind}; a label is a number, 0 or 1"
    if name == DENSE:
        if pa.types.is_fixed_size_list(kind) and pa.types.is_floating(kind.value_type):
            return None if kind.list_size == width else (
                f"holds {kind.list_size} values per row; --dense-in-features is {width}")
        if listed and pa.types.is_floating(kind.value_type):
            return None
        return (f"is {kind}; dense features are a list of {width} floats per row "
                f"(list<float> or fixed_size_list<float, {width}>)")
    if listed and pa.types.is_integer(kind.value_type):
        return None
    hint = "; store one id per row as a list of one" if pa.types.is_integer(kind) else ""
    return f"is {kind}; a feature's ids are list<int64> (or list<int32>), one list per row{hint}"


def _labels(column: pa.ChunkedArray, locate: Locate, what: str, problems: list[Problem]) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    array = _chunk(column)
    where = f"{what} column {LABEL!r}"
    wrong_type = type_problem(LABEL, array.type, 0)
    if wrong_type:
        problems.append(Problem(where, wrong_type))
        return np.zeros(len(array), np.float32)
    nulls = np.asarray(array.is_null()) if array.null_count else np.zeros(len(array), bool)
    if array.null_count:
        problems.append(Problem(where, f"{counted(array.null_count, 'null label')} in {len(array):,} rows read, "
                                       f"first at {locate(_first(nulls))}"))
        # the other rows' labels are checked all the same (a bool column's null filled as False)
        array = pc.fill_null(array, pa.scalar(0).cast(array.type) if pa.types.is_boolean(array.type) else 0)
    if pa.types.is_decimal(array.type):
        array = array.cast(pa.float64())
    # Checked before float32 rounds 0.99999999 or 1e-50 to a label it is not.
    exact: np.ndarray = array.to_numpy(zero_copy_only=False)
    bad = (exact != 0) & (exact != 1) & ~nulls
    if bad.any():
        first = _first(bad)
        problems.append(Problem(where, f"{counted(int(bad.sum()), 'label')} not 0 or 1 in {len(exact):,} rows read, "
                                       f"first {float(exact[first]):.15g} at {locate(first)}"))
    values = exact.astype(np.float32, copy=False)
    return np.zeros(len(array), np.float32) if nulls.any() else values


def _dense(column: pa.ChunkedArray, width: int, locate: Locate, what: str, problems: list[Problem]) -> np.ndarray:
    import pyarrow.compute as pc

    array = _chunk(column)
    where = f"{what} column {DENSE!r}"
    empty = np.zeros((len(array), width), np.float32)
    wrong_type = type_problem(DENSE, array.type, width)
    if wrong_type:
        problems.append(Problem(where, wrong_type))
        return empty
    before = len(problems)
    nulls = np.asarray(array.is_null()) if array.null_count else np.zeros(len(array), bool)
    if array.null_count:  # the other rows are checked all the same
        problems.append(Problem(where, f"{counted(array.null_count, 'null row')} in {len(array):,} rows read, first at "
                                       f"{locate(_first(nulls))}"))
    lengths = pc.list_value_length(array).fill_null(width).to_numpy(zero_copy_only=False)
    wrong = lengths != width
    if wrong.any():
        first = _first(wrong)
        problems.append(Problem(where, f"{int(wrong.sum()):,} of {len(array):,} rows read do not hold "
                                       f"{width} values (--dense-in-features), first {int(lengths[first])} at "
                                       f"{locate(first)}"))

    def row_of(value: int) -> int:
        """The row of list_flatten's ``value``-th value (null rows give none), whatever the rows'
        widths: a row of the wrong width hides none of the column's other bad values."""
        return int(pc.list_parent_indices(array)[value].as_py())

    values = pc.list_flatten(array)
    null_values = np.asarray(values.is_null()) if values.null_count else np.zeros(len(values), bool)
    if values.null_count:
        row = row_of(_first(null_values))
        problems.append(Problem(where, f"{counted(values.null_count, 'null value')} in {len(array):,} rows read, "
                                       f"first at {locate(row)}"))
    raw = pc.fill_null(values, 0).to_numpy(zero_copy_only=False) if values.null_count else \
        values.to_numpy(zero_copy_only=False)
    with np.errstate(over="ignore", invalid="ignore"):
        flat: np.ndarray = raw.astype(np.float32, copy=False)
    not_finite = ~np.isfinite(flat) & ~null_values
    if not_finite.any():
        first = _first(not_finite)
        row = row_of(first)
        problems.append(Problem(where, (
            f"{counted(int(not_finite.sum()), 'value')} not finite as float32 (NaN, infinite, or beyond +-3.4e38) "
            f"in {len(array):,} rows read, first {float(raw[first]):g} at {locate(row)}")))
    if len(problems) > before:
        return empty
    return flat.reshape(len(array), width)


def read_ids(column: pa.ChunkedArray, name: str, locate: Locate, what: str, problems: list[Problem]
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    array = _chunk(column)
    where = f"{what} column {name!r}"
    n = len(array)
    nothing = (np.zeros(n, np.int32), np.zeros(n + 1, np.int64), np.zeros(0, np.int64))
    wrong_type = type_problem(name, array.type, 0)
    if wrong_type:
        problems.append(Problem(where, wrong_type))
        return nothing
    counts, offsets, values = _lists(array)
    if values.null_count:
        import pyarrow.compute as pc

        row = _row_of(offsets, _first(np.asarray(values.is_null())))
        problems.append(Problem(where, f"{counted(values.null_count, 'null id')} in {n:,} rows read, "
                                       f"first at {locate(row)}"))
        values = pc.fill_null(values, 0)  # the other ids are checked all the same (in range: a null is not)
    ids = values.to_numpy(zero_copy_only=False)
    if ids.dtype != np.int64:
        ids = ids.astype(np.uint64).view(np.int64) if ids.dtype == np.uint64 else ids.astype(np.int64)
    return counts, offsets, ids


def _lists(array: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """A list array's items per row (int32; a null list holds none), their offsets from 0, and the
    items in row order."""
    import pyarrow.compute as pc

    if array.null_count:
        lengths = pc.fill_null(pc.list_value_length(array), 0)
        counts = lengths.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        return counts, _offsets(counts), pc.list_flatten(array)
    # Arrow's own offsets, rebased to the slice: no lengths to count
    raw = np.asarray(array.offsets).astype(np.int64)
    offsets = raw - raw[0]
    return np.diff(offsets).astype(np.int32), offsets, array.values.slice(int(raw[0]), int(offsets[-1]))


def _row_of(offsets: np.ndarray, item: int) -> int:
    """The row whose list holds the ``item``-th item (``offsets`` from ``_lists``)."""
    return int(np.searchsorted(offsets, item, side="right")) - 1


def read_weights(table: pa.Table, feature: str, id_lengths: np.ndarray | None, locate: Locate, what: str,
                 problems: list[Problem]) -> np.ndarray:
    """Weighted feature ``feature``'s weights (column ``<feature>_weights``): float32, one per id, in
    the order of its ids (``id_lengths``: the ids per row; None where the ids could not be read, and
    the lengths are not compared). Every kind of problem is one line; zeros where there is one."""
    name = weights_column(feature)
    where = f"{what} column {name!r}"
    nothing = np.zeros(0 if id_lengths is None else int(id_lengths.sum()), np.float32)
    if name not in table.column_names:
        problems.append(Problem(where, f"is missing: weighted feature {feature!r} needs its weights, a list of one "
                                       "float per id in each row (docs/training.md)"))
        return nothing
    array = _chunk(table.column(name))
    wrong_type = type_problem(name, array.type, 0, weights=True)
    if wrong_type:
        problems.append(Problem(where, wrong_type))
        return nothing
    found = len(problems)
    n = len(array)
    null_rows = np.asarray(array.is_null()) if array.null_count else np.zeros(n, bool)
    lengths, offsets, values = _lists(array)
    if id_lengths is not None:
        # A null list is an empty bag's weights, as a null list of ids is an empty bag.
        nulls = null_rows & (id_lengths > 0)
        if nulls.any():
            problems.append(Problem(where, f"{counted(int(nulls.sum()), 'null list')} for rows with ids in {n:,} rows "
                                           f"read, first at {locate(_first(nulls))}"))
        wrong = ~null_rows & (lengths != id_lengths)
        if wrong.any():
            first = _first(wrong)
            problems.append(Problem(where, (
                f"{int(wrong.sum()):,} of {n:,} rows read do not hold one weight per id of {feature!r}, first "
                f"{counted(int(lengths[first]), 'weight')} for {counted(int(id_lengths[first]), 'id')} at "
                f"{locate(first)}")))
    null_values = np.asarray(values.is_null()) if values.null_count else np.zeros(len(values), bool)
    if values.null_count:
        row = _row_of(offsets, _first(null_values))
        problems.append(Problem(where, f"{counted(values.null_count, 'null weight')} in {n:,} rows read, first at "
                                       f"{locate(row)}"))
    raw = values.to_numpy(zero_copy_only=False)  # nulls as NaN
    with np.errstate(over="ignore", invalid="ignore"):
        weights = raw.astype(np.float32, copy=False)
    not_finite = ~np.isfinite(weights) & ~null_values
    if not_finite.any():
        first = _first(not_finite)
        row = _row_of(offsets, first)
        problems.append(Problem(where, (
            f"{counted(int(not_finite.sum()), 'weight')} not finite as float32 (NaN, infinite, or beyond "
            f"+-3.4e38) in {n:,} rows read, first {float(raw[first]):g} at {locate(row)}")))
    return nothing if len(problems) > found else weights


def empty(layout: DataLayout, rows: int) -> Columns:
    """``rows`` rows of nothing (label 0, dense zeros, empty bags): padding that metrics leave out."""
    n = len(layout.slots)
    return Columns(np.zeros(rows, np.float32), np.zeros((rows, layout.dense_in_features), np.float32),
                   tuple(np.zeros(rows, np.int32) for _ in range(n)),
                   tuple(np.zeros(rows + 1, np.int64) for _ in range(n)),
                   tuple(np.zeros(0, np.int64) for _ in range(n)),
                   tuple(np.zeros(0, np.float32) if s.weighted else None for s in layout.slots))
