"""The check before launch: training data whose columns or values cannot work is named in seconds.

``data_problems`` reads the files' footers (schemas, row groups) and a sample of rows spread over
the dataset, and names every column of the wrong type, every missing column, and every kind of bad
value the sample shows (null or non-binary labels, dense rows of the wrong width, null ids, ids
out of range under ``--ids error``, weights that are null, non-finite or not one per id), each with
how many and an example row. A spec whose feature is named as a weighted feature's weights column
(``<feature>_weights``) is named first: no data can hold both. The ranks check every
row they read the same way (``rec.data.columns.from_arrow``): what the sample misses stops the job
as bad input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rec.data.columns import TRAINING, Columns, Locate, Wording, from_arrow_parts, type_problem
from rec.data.files import DataFiles, open_data
from rec.data.ids import IdsPolicy
from rec.data.layout import DataLayout
from rec.errors import InputError, Problem

if TYPE_CHECKING:
    import pyarrow as pa

SAMPLE_ROWS = 20_000  # rows the check reads, spread over up to SAMPLE_GROUPS row groups
SAMPLE_GROUPS = 8
# Dense values past this are unscaled counts, which DLRM-style models train on far worse (Criteo's
# reach 1e5-1e6; log(1 + x), which `shardflow data criteo` writes, keeps them under 15).
DENSE_SCALE = 1e3


def data_problems(source: str, layout: DataLayout, policy: IdsPolicy, what: str = "--data",
                  sample_rows: int = SAMPLE_ROWS, ranks: int = 1, wording: Wording = TRAINING) -> list[Problem]:
    """What makes ``source`` unusable as ``layout``'s training data on ``ranks`` ranks (each reads
    its share of every epoch: at least a row): its files, schemas and a sample (its bad values named
    as ``wording`` says)."""
    return data_findings(source, layout, policy, what, sample_rows, ranks, wording).problems


@dataclass(frozen=True)
class Findings:
    """What the check before launch found in a dataset: problems, and notes for the launcher ("" where
    there is none or the sample could not be read whole)."""

    problems: list[Problem]
    dense_note: str = ""  # ``dense_scale_note``
    label_note: str = ""  # ``one_class_note``


def data_findings(source: str, layout: DataLayout, policy: IdsPolicy, what: str = "--data",
                  sample_rows: int = SAMPLE_ROWS, ranks: int = 1, wording: Wording = TRAINING) -> Findings:
    """``data_problems``, and the notes on the sample's dense values and labels."""
    unreadable: list[Problem] = []  # files left out, so that the others' problems are named too
    try:
        files = open_data(source, what, unreadable)
    except InputError as e:
        return Findings(list(e.problems))
    problems = unreadable + schema_problems(files, layout, what)
    if files.rows < ranks:
        problems.append(Problem(what, f"{source} holds {files.rows:,} row{'s' if files.rows != 1 else ''}, fewer "
                                      f"than the {ranks} ranks: each rank reads its share of every epoch"))
    if layout.clashes(what):
        return Findings(problems)  # the sample needs every column of one meaning
    named = {p.where for p in problems}
    said = {p.reason for p in problems}  # the sample meets a column's type again, not naming the file
    # The sample's values, from the files whose columns training can read: each column once, of its type
    found, sample = _sample(files, layout, policy, what, sample_rows, wording, _readable_files(files, layout))
    problems += [p for p in found if p.where not in named and p.reason not in said]
    if sample is None:
        return Findings(problems)
    whole = len(sample) >= files.rows
    return Findings(problems, dense_scale_note(sample.dense, source, what),
                    one_class_note(sample.labels, source, what, whole))


def _readable_files(files: DataFiles, layout: DataLayout) -> set[int]:
    """The files (indexes of ``files.paths``) whose every column of ``layout`` is there once, of a type
    training reads."""
    weights = set(layout.weight_columns)
    good = {k for k, (_, schema) in enumerate(files.schemas)
            if all(schema.names.count(c) == 1 and type_problem(c, schema.field(c).type, layout.dense_in_features,
                                                               c in weights) is None for c in layout.columns)}
    return {file for file, k in enumerate(files.file_schemas) if k in good}


def schema_problems(files: DataFiles, layout: DataLayout, what: str = "--data") -> list[Problem]:
    """Every missing column and column of the wrong type, in each distinct schema of the files; only
    the clashes of feature names with weights columns where the spec has any (``DataLayout.clashes``:
    the spec, not the data, needs changing)."""
    clashes = layout.clashes(what)
    if clashes:
        return clashes
    problems: list[Problem] = []
    several = len(files.schemas) > 1
    weights = set(layout.weight_columns)
    needs = ("label, " if layout.labelled else "") + "dense and one column of ids per feature name" + (
        ", and one column <feature>_weights per feature of a weighted table" if weights else "")
    for file, schema in files.schemas:
        where = f"{what} column {{!r}}" + (f" of {files.paths[file]}" if several else "")
        problems += repeated_columns(files, file, schema, layout.columns, what)
        missing = [c for c in layout.columns if c not in schema.names]
        if missing:
            problems.append(Problem(f"{what} {files.paths[file]}" if several else what,
                                    f"has no column {missing_named(missing, schema.names, layout.columns)} (the "
                                    f"data needs {needs}: docs/training.md)"))
        for name in layout.columns:
            if schema.names.count(name) == 1:
                reason = type_problem(name, schema.field(name).type, layout.dense_in_features, name in weights)
                if reason:
                    problems.append(Problem(where.format(name), reason))
    return problems


def missing_named(missing: Sequence[str], present: Sequence[str], wanted: Sequence[str]) -> str:
    """``'a', 'b'``, each with the column of the file it is closest to where one is close and wanted
    by no other name (a misspelling: ``'search_terms' (the file has 'search_term')``)."""
    import difflib

    spare = [c for c in present if c not in wanted]
    named = []
    for c in missing:
        # one column per value (dense_0 ... dense_12, as many tables hold Criteo's): no one of them is the column
        numbered = sorted((s for s in spare if s.startswith(c) and s[len(c):].lstrip("_.-").isdigit()),
                          key=lambda s: int(s[len(c):].lstrip("_.-")))
        if len(numbered) > 1:
            named.append(f"{c!r} (the file has {len(numbered)} columns {numbered[0]!r} to {numbered[-1]!r} instead: "
                         f"{c!r} is one column holding a list of values per row)")
            continue
        close = difflib.get_close_matches(c, spare, n=1, cutoff=0.8)
        named.append(repr(c) + (f" (the file has {close[0]!r})" if close else ""))
    return ", ".join(named)


def repeated_columns(files: DataFiles, file: int, schema: pa.Schema, columns: tuple[str, ...],
                     what: str) -> list[Problem]:
    """Any of ``columns`` that ``schema`` (of ``files``' file ``file``) holds more than once (Parquet
    allows it; a column is read by its name)."""
    twice = [c for c in columns if schema.names.count(c) > 1]
    if not twice:
        return []
    return [Problem(f"{what} {files.paths[file]}" if len(files.schemas) > 1 else what,
                    f"holds column {', '.join(map(repr, twice))} more than once: name each column once")]


def sample_problems(files: DataFiles, layout: DataLayout, policy: IdsPolicy, what: str = "--data",
                    sample_rows: int = SAMPLE_ROWS) -> list[Problem]:
    """Every kind of bad value in a sample of rows from row groups spread over the dataset."""
    return _sample(files, layout, policy, what, sample_rows)[0]


def _sample(files: DataFiles, layout: DataLayout, policy: IdsPolicy, what: str, sample_rows: int,
            wording: Wording = TRAINING, only: set[int] | None = None) -> tuple[list[Problem], Columns | None]:
    """``sample_problems``, and the sample where every row of it converted; ``only``: of those files."""
    import pyarrow as pa

    groups = files.row_groups if only is None else tuple(g for g in files.row_groups if g.file in only)
    if not groups:
        return [], None
    picked = np.unique(np.linspace(0, len(groups) - 1, min(SAMPLE_GROUPS, len(groups))).round().astype(int))
    each = max(1, sample_rows // len(picked))
    parts: list[tuple[pa.Table, Locate]] = []
    unreadable: list[Problem] = []
    for g in picked:
        rg = groups[int(g)]
        first = sum(r.rows for r in groups[:int(g)] if r.file == rg.file)
        try:
            batch = next(files.parquet_file(rg.file).iter_batches(
                batch_size=min(each, rg.rows), row_groups=[rg.index], columns=list(layout.columns)), None)
        except (OSError, pa.ArrowException) as e:
            unreadable.append(files.unreadable(rg, e))
            continue
        if batch is not None:
            def locate(row: int, file: int = rg.file, first: int = first) -> str:
                return files.where(file, first + row)

            parts.append((pa.Table.from_batches([batch]), locate))
    if not parts:
        return unreadable, None
    try:
        sample = from_arrow_parts(parts, layout, policy, what, wording)
    except InputError as e:
        return unreadable + list(e.problems), None
    return unreadable, sample


def one_class_note(labels: np.ndarray, source: str, what: str = "--data", whole: bool = False) -> str:
    """A line for the launcher where every label of the sample (``whole``: of the data) is the same: a
    training can learn only that, an evaluation's AUC and NE are undefined; "" where both classes occur."""
    if not len(labels) or len(np.unique(labels)) > 1:
        return ""
    training = what == "--data"
    effect = "the model can learn only that" if training else "AUC and NE are undefined on one class"
    if whole:
        which, then = f"every label of {source}", effect + ("; give data of both classes" if training else "")
    else:  # very rare positives may be missing from a sample of the data
        which, then = f"every label in a sample of {len(labels):,} rows of {source}", f"if every row's is, {effect}"
    return f"note      {what}: {which} is {float(labels[0]):g}: {then}"


def dense_scale_note(dense: np.ndarray, source: str, what: str = "--data") -> str:
    """A line for the launcher where a sample's ``dense`` values are past ``DENSE_SCALE``: the model
    takes them as they are (a note, not a refusal: such data trains, only worse); "" where they are not."""
    finite = np.abs(dense[np.isfinite(dense)])
    largest = float(finite.max(initial=0.0))
    if largest <= DENSE_SCALE:
        return ""
    return (f"note      {what}: dense values up to {largest:.3g} in {source}: the model takes them as they are; "
            "scale them (log(1 + x), as `shardflow data criteo` writes) or it may train far worse")
