"""Criteo click logs (TSV, plain or gzip) as shardflow training data: Parquet files and their spec.

A Criteo line is a label, 13 integer features and 26 categorical features (8 hex digits, a hash),
tab-separated; an empty field is a missing value. The preprocessing is TorchRec's
(``torchrec.datasets.criteo``: ``BinaryCriteoUtils.tsv_to_npys``, then the ``hashes`` of
``InMemoryBinaryCriteoIterDataPipe``), so a model trained on the output sees what TorchRec's DLRM
example would feed it:

- a missing integer is 0; then, per input file, every integer is shifted by that file's smallest
  integer so that the smallest becomes 2, and ``dense = log(x - min + 2)`` in float32
  (``dense_np -= dense_np.min() - 2; np.log(dense_np, dtype=np.float32)``);
- a category is its hex value (a missing one 0, as ``int(x or "0", 16)``) modulo the table's rows;
- the label is 0 or 1. Here stricter than TorchRec, which reads a missing label as 0: an empty
  label (an empty line, a truncated file) is refused.

The shift needs the file's minimum before its first row is written, so each file is read twice,
streaming both times: a check of every line's field count, label and integers (and the minimum)
for every file before anything is written, then the conversion, which also checks the categories.
Files are written under temporary names in ``out`` and renamed once all are complete; on any
failure everything written is removed. Memory is bounded by a block of text and two row groups
(one gathered while the other is written), whatever the size of the input.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rec import progress
from rec.data.layout import DENSE, LABEL
from rec.errors import InputError, Problem, show
from rec.settings import knob
from rec.spec import Spec, spec_from_rows, write_spec

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

INT_NAMES = tuple(f"int_{i}" for i in range(13))  # TorchRec's DEFAULT_INT_NAMES
CAT_NAMES = tuple(f"cat_{i}" for i in range(26))  # TorchRec's DEFAULT_CAT_NAMES: the feature columns
FIELDS = 1 + len(INT_NAMES) + len(CAT_NAMES)
DENSE_IN_FEATURES = len(INT_NAMES)
MAX_PROBLEMS = 20  # reading stops once this many are found: they are shown on one screen
MAX_HEX_DIGITS = 15  # a category is at most 15 hex digits, so that it fits an int64 (Criteo's have 8)
BLOCK_BYTES = 1 << 22  # text parsed at once: about 16,000 Criteo lines
SPEC_NAME = "spec.yaml"
MIN_METADATA = b"shardflow.criteo.dense_min"  # the file's smallest integer, in each Parquet footer
TITLE = "Cannot convert the Criteo logs:"
LINE_RULE = f"a Criteo line has {FIELDS} tab-separated fields (label, 13 integers, 26 categories)"

_HEX = np.full(256, 255, np.uint8)  # byte -> its hex digit's value, 255 for any other byte
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


class Compression(StrEnum):
    LZ4 = "lz4"
    SNAPPY = "snappy"
    ZSTD = "zstd"
    NONE = "none"


@dataclass(frozen=True)
class CriteoSettings:
    """How the logs become training data: the tables' rows and dim, the Parquet row groups."""

    rows_per_table: int = field(metadata=knob(
        "rows of each of the 26 tables: a category's id is its hash modulo this", minimum=1))
    embedding_dim: int = field(default=64, metadata=knob(
        "embedding_dim of the tables in the spec written beside the data (a multiple of 4)", minimum=4,
        maximum=2048))
    rows_per_group: int = field(default=65_536, metadata=knob(
        "rows per Parquet row group: the unit the training ranks split and shuffle", minimum=1,
        maximum=1 << 24))
    compression: Compression = field(default=Compression.LZ4, metadata=knob(
        "the Parquet files' codec: lz4 (LZ4_RAW) decodes about twice as fast as snappy at about the same "
        "size, and needs a reader from 2022 or later (pyarrow, DuckDB, Spark 3.4+); snappy for older readers, "
        "zstd for smaller files, none for the fastest reads"))

    def problems(self) -> list[Problem]:
        if self.embedding_dim % 4:
            return [Problem("--embedding-dim", f"must be a multiple of 4 (FBGEMM's fused kernels), got "
                                               f"{self.embedding_dim}")]
        return []


@dataclass(frozen=True)
class Converted:
    """What ``convert_criteo`` wrote: one Parquet file per input file, in input order, and the spec."""

    out: Path
    files: tuple[Path, ...]
    rows: tuple[int, ...]  # per file
    dense_min: tuple[int, ...]  # per file: its smallest integer (missing ones count as 0)
    spec: Path

    @property
    def total_rows(self) -> int:
        return sum(self.rows)


def criteo_spec(settings: CriteoSettings) -> Spec:
    """The 26 tables the converted data feeds: ``t_cat_i`` reads feature ``cat_i``, one id per sample."""
    return spec_from_rows([{"name": f"t_{name}", "num_embeddings": settings.rows_per_table,
                            "embedding_dim": settings.embedding_dim, "feature_names": [name], "pooling_factor": 1.0}
                           for name in CAT_NAMES], source="--rows-per-table and --embedding-dim")


def output_schema() -> pa.Schema:
    """label float32, dense fixed_size_list<float32, 13>, and cat_0 .. cat_25 list<int64>."""
    import pyarrow as pa

    return pa.schema([(LABEL, pa.float32()), (DENSE, pa.list_(pa.float32(), DENSE_IN_FEATURES)),
                      *((name, pa.list_(pa.int64())) for name in CAT_NAMES)])


def convert_criteo(inputs: Sequence[str | Path], out: str | Path, settings: CriteoSettings) -> Converted:
    """Convert ``inputs`` into ``out`` (new or empty): ``part-00000.parquet`` ... and ``spec.yaml``.

    Bad input is an InputError naming each file and line (up to ``MAX_PROBLEMS``); on any failure
    ``out`` is left as it was found.
    """
    spec = criteo_spec(settings)
    out = Path(out)
    problems = _out_problems(out) + [p for path in inputs for p in _input_problems(str(path))]
    if problems:
        raise InputError(TITLE, problems)
    files = [_Input(str(path)) for path in inputs]
    if not files:
        raise InputError(TITLE, [Problem("TSV", "no input files given")])
    meter = _Meter(files)
    found = _Found()
    minima = []
    for file in files:
        if found.full:
            break
        minima.append(_check(file, found, meter))
    if found.problems:
        for file in files:  # only where the check failed: the categories are otherwise checked as written
            _check_categories(file, found, meter)
        raise InputError(TITLE, list(dict.fromkeys(found.problems)))  # a short line is found by both readings
    width = max(5, len(str(len(files) - 1)))
    names = [out / f"part-{i:0{width}d}.parquet" for i in range(len(files))]
    temporary = [out / f".{name.name}.tmp" for name in names]
    spec_tmp = out / f".{SPEC_NAME}.tmp.yaml"  # write_spec knows the format by the extension
    if _out_problems(out):  # something was put there while the files were checked
        raise InputError(TITLE, _out_problems(out))
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        rows = []
        for file, smallest, path in zip(files, minima, temporary, strict=True):
            # After a bad category the files are still read to the end (nothing more written), so that
            # every bad line of every file is named in one run, up to MAX_PROBLEMS.
            rows.append(_write(file, smallest, path, settings, found, meter))
            if found.full:
                break
        if found.problems:
            raise InputError(TITLE, found.problems)
        write_spec(spec, spec_tmp)
        for path, name in zip(temporary, names, strict=True):
            path.rename(name)
        spec_tmp.rename(out / SPEC_NAME)
    except BaseException:
        for path in [*temporary, *names, spec_tmp, out / SPEC_NAME]:
            path.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    return Converted(out, tuple(names), tuple(rows), tuple(minima), out / SPEC_NAME)


def _out_problems(out: Path) -> list[Problem]:
    if out.is_dir():
        try:
            entries = next(os.scandir(out), None)
        except OSError as e:
            return [Problem(f"--out {out}", f"cannot be read: {e.strerror}")]
        return [] if entries is None else [Problem(f"--out {out}", "is not empty: give a new or empty directory "
                                                                   "(nothing in it is overwritten)")]
    if out.exists() or out.is_symlink():
        return [Problem(f"--out {out}", "exists and is not a directory")]
    return []


def _input_problems(path: str) -> list[Problem]:
    try:
        with open(path, "rb") as f:
            empty = not f.read(1)
    except IsADirectoryError:
        return [Problem(path, "is a directory; give the TSV files themselves")]
    except OSError as e:
        return [Problem(path, f"cannot be read: {e.strerror or e}")]
    return [Problem(path, "is empty")] if empty else []


@dataclass
class _Input:
    """One input file: its path as the user gave it, whether it is gzip (by its first bytes), its size."""

    path: str
    gzip: bool = field(init=False)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        with open(self.path, "rb") as f:
            self.gzip = f.read(2) == b"\x1f\x8b"
        self.size = os.path.getsize(self.path)


@dataclass
class _Found:
    """The problems found so far; reading stops at ``limit``."""

    limit: int = MAX_PROBLEMS
    problems: list[Problem] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return len(self.problems) >= self.limit

    def add(self, where: str, reason: str) -> None:
        if not self.full:
            self.problems.append(Problem(where, reason))


@dataclass
class _Meter:
    """Progress in bytes of input read, over both readings of every file."""

    files: list[_Input]
    read: int = 0

    def report(self, file: _Input, stage: str, rows: int, position: int) -> None:
        total = 2 * sum(f.size for f in self.files) >> 20
        done = min(self.read + position >> 20, total)
        index = self.files.index(file) + 1
        progress.update(f"{stage} {Path(file.path).name} ({index}/{len(self.files)}), {rows:,} rows, "
                        f"{done}/{total} MiB", done, total)


@dataclass
class _Batch:
    """Where a block of rows came from, to name its lines in problems."""

    file: _Input
    first: int  # the file's row index of the block's first row
    skipped: list[int]  # line numbers the reader skipped so far (wrong field counts), ascending
    found: _Found

    def line(self, row: int) -> int:
        """The line number of the block's row ``row``."""
        line = self.first + row + 1
        for skipped in self.skipped:
            if skipped > line:
                break
            line += 1
        return line

    def report(self, rows: np.ndarray, reason: Callable[[int], str]) -> None:
        for row in rows[:max(0, self.found.limit - len(self.found.problems))]:
            self.found.add(f"{self.file.path} line {self.line(int(row)):,}", reason(int(row)))


def _blocks(file: _Input, columns: Sequence[str], found: _Found, meter: _Meter, stage: str, *, typed: bool,
            raises: bool = False) -> Iterator[tuple[_Batch, pa.RecordBatch]]:
    """``columns`` of the file's lines, block by block: the integers as int64 (``typed``: the parser
    converts them) or as bytes, like the label and categories. Lines with a wrong field count are
    problems; so is an error that ends the reading, unless ``raises``."""
    import pyarrow as pa
    import pyarrow.csv as csv

    skipped: list[int] = []

    def invalid(row: Any) -> str:
        if found.full:
            return "error"
        line = int(row.number) if row.number is not None else 0
        skipped.append(line)
        count = row.actual_columns
        found.add(f"{file.path} line {line:,}", f"has {count} field{'s' if count != 1 else ''}; {LINE_RULE}")
        return "skip"

    read = csv.ReadOptions(column_names=[LABEL, *INT_NAMES, *CAT_NAMES], use_threads=False, block_size=BLOCK_BYTES)
    # No quoting: a quote is an ordinary byte (Criteo has none); an empty line is a row (its label empty).
    parse = csv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False, ignore_empty_lines=False,
                             invalid_row_handler=invalid)
    types = {name: pa.int64() if typed and name in INT_NAMES else pa.binary() for name in columns}
    convert = csv.ConvertOptions(column_types=types, include_columns=list(columns), strings_can_be_null=False,
                                 null_values=[""])
    rows = 0
    with pa.OSFile(file.path) as raw:
        stream = pa.CompressedInputStream(raw, "gzip") if file.gzip else raw
        try:
            for batch in csv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert):
                yield _Batch(file, rows, skipped, found), batch
                rows += batch.num_rows
                meter.report(file, stage, rows, raw.tell())
                if found.full:
                    return
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            if raises and not found.full:
                raise
            if not found.full:
                read = rows + len(skipped)  # 0: not one block of lines came out whole
                found.add(file.path, f"cannot be read{f' after line {read:,}' if read else ''}: {_first_line(e)}")
        finally:
            meter.read += file.size
    if rows == 0 and not found.problems:
        found.add(file.path, "holds no lines")


def _first_line(error: Exception) -> str:
    return show(str(error).splitlines()[0] if str(error) else type(error).__name__, 200)


def _check(file: _Input, found: _Found, meter: _Meter) -> int:
    """Check the field count, label and integers of every line of ``file``; its smallest integer
    (missing ones count as 0). The parser converts the integers; where that fails, the file is read
    again as text to name every bad line."""
    before = meter.read
    attempt = _Found(found.limit - len(found.problems))
    try:
        span = _scan(file, attempt, meter, typed=True)
    except (OSError, ValueError):
        meter.read = before
        attempt = _Found(attempt.limit)
        span = _scan(file, attempt, meter, typed=False)
    found.problems += attempt.problems
    low, high = span
    if high - low + 2 > np.iinfo(np.int64).max:
        found.add(file.path, f"its integers range from {low} to {high}: too far apart for 64-bit integers")
    return low


def _check_categories(file: _Input, found: _Found, meter: _Meter) -> None:
    """Name the bad categories of ``file``, up to the problem limit."""
    for at, batch in _blocks(file, CAT_NAMES, found, meter, "checking", typed=False):
        for i, name in enumerate(CAT_NAMES):
            _categories(batch.column(i), name, at)


def _scan(file: _Input, found: _Found, meter: _Meter, typed: bool) -> tuple[int, int]:
    """The smallest and largest integer of ``file`` (a missing one is 0), checking its lines on the way."""
    low, high = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    ints: Callable[[pa.Array, str, _Batch], np.ndarray] = _typed_ints if typed else _text_ints
    for at, batch in _blocks(file, [LABEL, *INT_NAMES], found, meter, "checking", typed=typed, raises=typed):
        _labels(batch.column(0), at)
        for i, name in enumerate(INT_NAMES):
            values = ints(batch.column(1 + i), name, at)
            if len(values):
                low, high = min(low, int(values.min())), max(high, int(values.max()))
    return (low, high) if low <= high else (0, 0)


def _write(file: _Input, smallest: int, path: Path, settings: CriteoSettings, found: _Found, meter: _Meter) -> int:
    """Convert ``file`` into the Parquet file ``path``; the rows written (none after a problem: the
    file is read on to name its other bad lines)."""
    import pyarrow.parquet as pq

    schema = output_schema().with_metadata({MIN_METADATA: str(smallest).encode()})
    # No dictionaries and no statistics: they cost about half the writing time, and training uses neither.
    with pq.ParquetWriter(path, schema, compression=settings.compression.value, use_dictionary=False,
                          write_statistics=False) as writer, \
            _RowGroups(writer, schema, settings.rows_per_group) as groups:
        for at, batch in _blocks(file, [LABEL, *INT_NAMES, *CAT_NAMES], found, meter, "converting", typed=True):
            converted = _convert(batch, at, smallest, settings.rows_per_table, schema)
            if converted is not None:
                groups.add(converted)
    return groups.written


def _convert(batch: pa.RecordBatch, at: _Batch, smallest: int, rows: int, schema: pa.Schema) -> pa.RecordBatch | None:
    """One block of lines in the output's columns; None where it holds a problem."""
    import pyarrow as pa

    n = batch.num_rows
    labels = _labels(batch.column(0), at)
    ints = np.empty((n, DENSE_IN_FEATURES), np.int64)
    for i, name in enumerate(INT_NAMES):
        ints[:, i] = _typed_ints(batch.column(1 + i), name, at)
    ids = [_categories(batch.column(1 + DENSE_IN_FEATURES + i), name, at) for i, name in enumerate(CAT_NAMES)]
    if at.found.problems:
        return None
    ints -= smallest - 2
    dense = pa.FixedSizeListArray.from_arrays(pa.array(np.log(ints.astype(np.float32).ravel())), DENSE_IN_FEATURES)
    one_each = pa.array(np.arange(n + 1, dtype=np.int32))
    cats = [pa.ListArray.from_arrays(one_each, pa.array(v % rows)) for v in ids]
    return pa.RecordBatch.from_arrays([pa.array(labels), dense, *cats], schema=schema)


class _RowGroups:
    """Blocks gathered into row groups of ``size`` rows. A thread writes each (Arrow encodes and
    compresses without the GIL) while the next is converted; one is written at a time."""

    def __init__(self, writer: pq.ParquetWriter, schema: pa.Schema, size: int):
        self.writer, self.schema, self.size = writer, schema, size
        self.pending: list[pa.RecordBatch] = []
        self.waiting = self.written = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="criteo-write")
        self._writing: Future[None] | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        import pyarrow as pa

        self.pending.append(batch)
        self.waiting += batch.num_rows
        if self.waiting >= self.size:
            full = self.waiting - self.waiting % self.size
            table = pa.Table.from_batches(self.pending, self.schema)
            self._write(table.slice(0, full))
            self.pending = table.slice(full).to_batches()
            self.waiting -= full

    def _write(self, table: pa.Table) -> None:
        if self._writing is not None:
            self._writing.result()
        self._writing = self._pool.submit(self.writer.write_table, table, row_group_size=self.size)
        self.written += table.num_rows

    def __enter__(self) -> _RowGroups:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None and self.waiting:
                import pyarrow as pa

                self._write(pa.Table.from_batches(self.pending, self.schema))
            if self._writing is not None:
                self._writing.result()
        finally:
            self._pool.shutdown(wait=True)


def _offsets(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's value offsets (into the returned bytes) and its bytes, without copies."""
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], np.int32, len(array) + 1, array.offset * 4)
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def _text(array: pa.Array, row: int) -> str:
    value = array[row].as_py()
    return show(value.decode("utf-8", "backslashreplace"))


def _labels(array: pa.Array, at: _Batch) -> np.ndarray:
    """The labels as float32; a label other than 0 or 1 (or empty) is a problem."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ok = pc.is_in(array, value_set=pa.array([b"0", b"1"], pa.binary()))
    if not pc.all(ok).as_py():
        bad = np.flatnonzero(~ok.to_numpy(zero_copy_only=False))
        at.report(bad, lambda r: "the label is empty; a label is 0 or 1" if not array[r].as_py()
                  else f"the label is {_text(array, r)}; a label is 0 or 1")
    labels: np.ndarray = pc.equal(array, b"1").to_numpy(zero_copy_only=False).astype(np.float32)
    return labels


def _typed_ints(array: pa.Array, name: str, at: _Batch) -> np.ndarray:
    """An integer column the parser converted, as int64, a missing value 0."""
    values: np.ndarray = array.fill_null(0).to_numpy(zero_copy_only=False)
    return values


def _text_ints(array: pa.Array, name: str, at: _Batch) -> np.ndarray:
    """An integer column read as bytes, converted as the parser would (spaces around a number are
    ignored), a missing (empty) value 0; every value the parser refuses is a problem, spaces alone too."""
    import pyarrow as pa
    import pyarrow.compute as pc

    trimmed = pc.ascii_trim(array.view(pa.string()), " ").view(pa.binary())
    values = pc.if_else(pc.equal(pc.binary_length(array), 0), pa.scalar(None, pa.binary()), trimmed)
    try:
        return pc.cast(values, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]
    except pa.ArrowInvalid:
        pass
    plain = pc.match_substring_regex(values, "^-?[0-9]{1,18}$").fill_null(True).to_numpy(zero_copy_only=False)
    bad: list[int] = []
    for row in np.flatnonzero(~plain):  # the others may still be numbers to the parser (0x1f): ask it
        if len(bad) >= at.found.limit - len(at.found.problems):
            break
        try:
            pc.cast(values[int(row):int(row) + 1], pa.int64())
        except pa.ArrowInvalid:
            bad.append(int(row))
    at.report(np.array(bad, np.int64), lambda r: f"{name} is {_text(array, r)}; an integer field holds an "
                                                 "optional '-' and digits, within 64 bits (+-9.2e18)")
    return np.zeros(len(array), np.int64)


def _categories(array: pa.Array, name: str, at: _Batch) -> np.ndarray:
    """A category column's hex values as int64, a missing value 0; anything but 1 to ``MAX_HEX_DIGITS``
    hex digits is a problem."""
    offsets, data = _offsets(array)
    start, stop = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    present = lengths > 0
    digits = np.take(_HEX, data[start:stop])
    values = np.zeros(len(array), np.int64)
    if (lengths[present] == 8).all():  # Criteo's: 8 digits each, packed 8 at a time
        if digits.size and digits.max() == 255:
            bad = np.zeros(len(array), bool)
            bad[present] = (digits.reshape(-1, 8) == 255).any(axis=1)
        else:
            values[present] = _pack8(digits.view("<u8")).view(np.int64)
            return values
    else:
        owner = np.repeat(np.arange(len(array)), lengths)  # the value each digit belongs to
        bad = lengths > MAX_HEX_DIGITS
        bad[owner[digits == 255]] = True
        if not bad.any():
            after = (offsets[1:][owner] - start - 1) - np.arange(stop - start)  # digits after it in its value
            starts = (offsets[:-1] - start)[present]
            if len(starts):
                values[present] = np.add.reduceat(digits.astype(np.int64) << (after.astype(np.int64) * 4), starts)
    if bad.any():
        at.report(np.flatnonzero(bad), lambda r: f"{name} is {_text(array, r)}; a category is 1 to "
                                                 f"{MAX_HEX_DIGITS} hex digits")
    return values


_BYTES, _PAIRS, _QUADS = np.uint64(0x00FF00FF00FF00FF), np.uint64(0x0000FFFF0000FFFF), np.uint64(0xFFFFFFFF)


def _pack8(nibbles: np.ndarray) -> np.ndarray:
    """Eight hex digits' values, one per byte of a little-endian uint64 (the first digit lowest), as the number
    they write (the first digit highest): three rounds of merging neighbours."""
    v = ((nibbles & _BYTES) << np.uint64(4)) | ((nibbles >> np.uint64(8)) & _BYTES)
    v = ((v & _PAIRS) << np.uint64(8)) | ((v >> np.uint64(16)) & _PAIRS)
    return ((v & _QUADS) << np.uint64(16)) | (v >> np.uint64(32))
