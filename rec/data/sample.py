"""A sample of training data's ids for ``shardflow spec stats``: whole row groups chosen at random
(with a seed) until the sample holds the rows asked for, only the feature columns read.

Whole row groups, because Parquet reads no less, and chosen over the whole dataset, so the sample
sees every part of it (a dataset written in time order changes along its files). The groups are read
in path order, each file opened once; a group that would overshoot the rows asked for is cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rec import progress
from rec.data.columns import read_ids
from rec.data.files import DataFiles, RowGroup, open_data
from rec.data.schema import missing_named, repeated_columns
from rec.errors import InputError, Problem

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class IdSample:
    """Per feature column, the ids of ``rows`` samples: lengths per sample and the ids in order, in
    parts (one per row group read: joined only once per table, so the sample is copied once)."""

    rows: int
    lengths: dict[str, np.ndarray]  # int32 (rows,)
    ids: dict[str, list[np.ndarray]]  # int64, sum(lengths) ids in all
    row_groups: int  # row groups read
    total_rows: int  # rows in the dataset

    def offsets(self, column: str) -> np.ndarray:
        """int64 (rows + 1,): where each sample's ids start in ``ids[column]``."""
        offsets = np.zeros(self.rows + 1, np.int64)
        np.cumsum(self.lengths[column], out=offsets[1:])
        return offsets


def read_sample(source: str, columns: tuple[str, ...], sample_rows: int, seed: int,
                what: str = "DATA") -> IdSample:
    """``sample_rows`` rows of ``source`` (all of them when it holds fewer), ``columns`` only.

    InputError naming every column missing from the data or of the wrong type, and any column whose
    sample holds a null id.
    """
    import pyarrow as pa

    files = open_data(source, what)
    # Each file's columns of a type that holds ids are read, whatever its others: one error names every problem
    problems, readable = _schema_problems(files, columns, what)
    picks = pick_groups(files.row_groups, sample_rows, seed)
    total = sum(take for _, take in picks)
    lengths: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    ids: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    done = 0
    first_rows = _first_rows(files.row_groups)
    unreadable: list[Problem] = []
    for g, take in picks:
        group = files.row_groups[g]
        read = readable[group.file]
        try:
            table = files.parquet_file(group.file).read_row_group(group.index, columns=list(read))
        except (OSError, pa.ArrowException) as e:
            unreadable.append(files.unreadable(group, e))
            continue
        if take < table.num_rows:
            table = table.slice(0, take)
        bad_values: list[Problem] = []
        _read_columns(table, read, lengths, ids, files, group.file, first_rows[g], what, bad_values)
        if bad_values:  # the first row group with bad values names them, beside every column's problem
            problems += bad_values
            break
        done += take
        progress.update(f"{done:,} of {total:,} rows", done, total)
    if problems:
        raise InputError(f"Cannot measure the data {files.source}:", [*unreadable, *problems])
    if unreadable:
        raise InputError(f"Cannot read the data {source}:", unreadable)
    return IdSample(total, {c: np.concatenate(lengths[c]) for c in columns}, ids, len(picks), files.rows)


def pick_groups(groups: tuple[RowGroup, ...], sample_rows: int, seed: int) -> list[tuple[int, int]]:
    """(index into ``groups``, rows to take from its start) for the groups sampled, in path order:
    groups in a random order of ``seed`` until they hold ``sample_rows`` rows, the last one cut."""
    order = np.random.default_rng(seed).permutation(len(groups))
    sizes = np.array([groups[g].rows for g in order], np.int64)
    ends = np.cumsum(sizes)
    count = min(int(np.searchsorted(ends, sample_rows)) + 1, len(groups))  # groups until the sample is full
    chosen = order[:count].tolist()
    takes = sizes[:count].tolist()
    if ends[count - 1] > sample_rows:
        takes[-1] -= int(ends[count - 1]) - sample_rows
    return sorted(zip(chosen, takes, strict=True))


def _first_rows(groups: tuple[RowGroup, ...]) -> list[int]:
    """Each group's first row within its file (for messages)."""
    first, previous, rows = [], -1, 0
    for g in groups:
        rows = rows if g.file == previous else 0
        first.append(rows)
        rows += g.rows
        previous = g.file
    return first


def _schema_problems(files: DataFiles, columns: tuple[str, ...], what: str
                     ) -> tuple[list[Problem], dict[int, tuple[str, ...]]]:
    """Every column missing from a file's schema or of a type that holds no ids, and of each file (by
    its index in ``files.paths``) the columns that can be read."""
    import pyarrow as pa

    problems: list[Problem] = []
    good: list[tuple[str, ...]] = []  # per schema of files.schemas
    several = len(files.schemas) > 1
    for file, schema in files.schemas:
        at = f" of {files.paths[file]}" if several else ""
        missing = [c for c in columns if c not in schema.names]
        if missing:
            problems.append(Problem(f"{what} {files.paths[file]}" if several else what, (
                f"has no column {missing_named(missing, schema.names, columns)}: the ids of each feature name of "
                "the spec's tables are a list<int64> column of that name")))
        problems += repeated_columns(files, file, schema, columns, what)
        fine = []
        for c in columns:
            if schema.names.count(c) == 1:  # an empty column of the type gets the message reading it would
                before = len(problems)
                read_ids(pa.chunked_array([], type=schema.field(c).type), c, lambda _: "", what + at, problems)
                if len(problems) == before:
                    fine.append(c)
        good.append(tuple(fine))
    return problems, {file: good[k] for file, k in enumerate(files.file_schemas) if k >= 0}


def _read_columns(table: pa.Table, columns: tuple[str, ...], lengths: dict[str, list[np.ndarray]],
                  ids: dict[str, list[np.ndarray]], files: DataFiles, file: int, first: int, what: str,
                  problems: list[Problem]) -> None:
    """The ids of ``columns`` of one row group, added to ``lengths`` and ``ids``; their bad values to
    ``problems``."""
    for c in columns:
        n, _, v = read_ids(table.column(c), c, lambda row: files.where(file, first + row), what, problems)
        lengths[c].append(n)
        ids[c].append(v)

