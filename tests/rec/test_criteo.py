"""``rec.data.criteo``: Criteo TSV to training Parquet, preprocessed exactly as TorchRec does."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rec.data import criteo
from rec.data.criteo import CAT_NAMES, MAX_PROBLEMS, MIN_METADATA, CriteoSettings, convert_criteo
from rec.errors import InputError

ROWS = 1000  # --rows-per-table of most tests


def criteo_lines(n: int, seed: int = 0) -> list[str]:
    """``n`` Criteo lines with what real logs hold: missing fields, negative integers, hashes of 8 hex
    digits (lower and upper case); cat_20 .. cat_25 also shorter hashes (1 to 8 digits)."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        label = str(int(rng.random() < 0.3))
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(-3, 5000))) for _ in range(13)]
        cats = []
        for c in range(26):
            value = int(rng.integers(0, 2**32))
            digits = 8 if c < 20 else int(rng.integers(1, 9))
            text = f"{value:08x}"[-digits:]
            cats.append("" if rng.random() < 0.1 else text.upper() if rng.random() < 0.2 else text)
        lines.append("\t".join([label, *ints, *cats]))
    return lines


def write_tsv(path: Path, lines: list[str], gzipped: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if gzipped else data)
    return path


def all_present(lines: list[str]) -> list[str]:
    """``lines`` with every integer present and positive: the file's minimum is above 0."""
    fields = [line.split("\t") for line in lines]
    return ["\t".join([f[0], *(str(abs(int(x or "9")) + 5) for x in f[1:14]), *f[14:]]) for f in fields]


def expected(lines: list[str], rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels, dense and ids computed line by line, as TorchRec's tsv_to_npys reads them (``int(x or "0")``,
    ``int(x or "0", 16)``; dense shifted by the file's minimum to 2, then the log) and its ``hashes`` map ids."""
    fields = [line.split("\t") for line in lines]
    ints = [[int(f or "0") for f in row[1:14]] for row in fields]
    low = min(min(row) for row in ints)
    labels = np.array([float(row[0]) for row in fields], np.float32)
    dense = np.array([[math.log(v - low + 2) for v in row] for row in ints], np.float32)
    ids = np.array([[int(f or "0", 16) % rows for f in row[14:]] for row in fields], np.int64)
    return labels, dense, ids


def read_back(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    table = pq.read_table(path)
    dense = np.stack(table.column("dense").to_numpy(zero_copy_only=False))
    ids = np.stack([np.concatenate(table.column(c).to_numpy(zero_copy_only=False)) for c in CAT_NAMES], axis=1)
    return table.column("label").to_numpy(), dense, ids


def problems(error: pytest.ExceptionInfo[InputError]) -> list[str]:
    return [str(p) for p in error.value.problems]


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_every_row_is_preprocessed_as_torchrec_does(tmp_path, gzipped):
    lines = criteo_lines(300)
    tsv = write_tsv(tmp_path / ("day_0.gz" if gzipped else "day_0"), lines, gzipped)
    done = convert_criteo([tsv], tmp_path / "out", CriteoSettings(rows_per_table=ROWS))
    labels, dense, ids = read_back(done.files[0])
    want_labels, want_dense, want_ids = expected(lines, ROWS)
    assert done.rows == (300,)
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_allclose(dense, want_dense, rtol=1e-6)
    np.testing.assert_array_equal(ids, want_ids)
    low = min(int(f or "0") for line in lines for f in line.split("\t")[1:14])
    assert low < 0 and done.dense_min == (low,)
    assert pq.read_schema(done.files[0]).metadata[MIN_METADATA] == str(low).encode()


def test_the_shift_is_the_files_own_minimum_even_when_nothing_is_missing(tmp_path):
    lines = all_present(criteo_lines(50))
    done = convert_criteo([write_tsv(tmp_path / "day", lines)], tmp_path / "out", CriteoSettings(ROWS))
    low = min(int(x) for line in lines for x in line.split("\t")[1:14])
    assert low >= 5 and done.dense_min == (low,)
    np.testing.assert_allclose(read_back(done.files[0])[1], expected(lines, ROWS)[1], rtol=1e-6)
    assert read_back(done.files[0])[1].min() == np.float32(math.log(2))


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")  # torchrec and fbgemm importing
@pytest.mark.parametrize("present", [False, True], ids=["missing-values", "all-present"])
def test_output_equals_torchrecs_own_preprocessing(tmp_path, present):
    from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES, BinaryCriteoUtils
    from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe as NpyDataPipe

    assert (list(CAT_NAMES), list(criteo.INT_NAMES)) == (DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES)
    lines = all_present(criteo_lines(500, seed=1)) if present else criteo_lines(500, seed=1)
    tsv = write_tsv(tmp_path / "day_1.tsv", lines)
    npys = [str(tmp_path / f"{part}.npy") for part in ("dense", "sparse", "labels")]
    BinaryCriteoUtils.tsv_to_npys(str(tsv), *npys)
    batch = next(iter(NpyDataPipe("train", *([p] for p in npys), batch_size=500, rank=0, world_size=1,
                                  hashes=[ROWS] * 26)))
    torchrec_ids = batch.sparse_features.to_dict()

    labels, dense, ids = read_back(convert_criteo([tsv], tmp_path / "out", CriteoSettings(ROWS)).files[0])
    np.testing.assert_array_equal(dense, batch.dense_features.numpy())  # bit for bit
    np.testing.assert_array_equal(labels, batch.labels.numpy())
    for i, name in enumerate(CAT_NAMES):
        np.testing.assert_array_equal(ids[:, i], torchrec_ids[name].values().numpy())


def test_gzip_is_known_by_its_bytes_not_its_name(tmp_path):
    lines = criteo_lines(20)
    plain_named_gz = write_tsv(tmp_path / "a.gz", lines)
    gzip_named_tsv = write_tsv(tmp_path / "b.tsv", lines, gzipped=True)
    done = convert_criteo([plain_named_gz, gzip_named_tsv], tmp_path / "out", CriteoSettings(ROWS))
    first, second = (read_back(f) for f in done.files)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_output_layout_files_schema_row_groups_and_spec(tmp_path):
    tsvs = [write_tsv(tmp_path / f"day_{i}", criteo_lines(10, seed=i)) for i in range(2)]
    out = tmp_path / "out"
    done = convert_criteo(tsvs, out, CriteoSettings(rows_per_table=77, embedding_dim=16, rows_per_group=4))
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet", "part-00001.parquet", "spec.yaml"]
    meta = pq.ParquetFile(done.files[0]).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [4, 4, 2]
    schema = pq.read_schema(done.files[0])
    assert [str(t) for t in schema.types[:3]] == ["float", "fixed_size_list<element: float>[13]",
                                                  "list<element: int64>"]
    assert schema.names == ["label", "dense", *CAT_NAMES]

    from rec.spec import read_spec

    spec = read_spec(done.spec)
    assert [(t.name, t.num_embeddings, t.embedding_dim, t.feature_names) for t in spec.tables] == [
        (f"t_{c}", 77, 16, (c,)) for c in CAT_NAMES]


def test_bad_lines_are_named_by_file_and_line_and_nothing_is_written(tmp_path):
    lines = criteo_lines(12)
    fields = lines[3].split("\t")
    lines[1] = "\t".join(lines[1].split("\t")[:39])  # a field short
    lines[3] = "\t".join(["1", "12", "x7", *fields[3:]])  # int_1 is no number
    lines[5] = "2" + lines[5][1:]  # label 2
    lines[8] = ""  # an empty line
    lines[10] = "\t".join(["0", " ", *lines[10].split("\t")[2:]])  # int_0 spaces alone: no number
    tsv = write_tsv(tmp_path / "day_0", lines)
    out = tmp_path / "out"
    with pytest.raises(InputError) as error:
        convert_criteo([write_tsv(tmp_path / "good", criteo_lines(5)), tsv], out, CriteoSettings(ROWS))
    where = str(tsv)
    assert problems(error) == [
        f"{where} line 2: has 39 fields; a Criteo line has 40 tab-separated fields (label, 13 integers, 26 categories)",
        f"{where} line 6: the label is '2'; a label is 0 or 1",
        f"{where} line 9: the label is empty; a label is 0 or 1",
        f"{where} line 11: int_0 is ' '; an integer field holds an optional '-' and digits, "
        "within 64 bits (+-9.2e18)",
        f"{where} line 4: int_1 is 'x7'; an integer field holds an optional '-' and digits, "
        "within 64 bits (+-9.2e18)",
    ]
    assert not out.exists()


def test_a_bad_category_found_while_writing_leaves_nothing_behind(tmp_path):
    lines = criteo_lines(30)
    fields = lines[20].split("\t")
    fields[14 + 4] = "12g4"
    lines[20] = "\t".join(fields)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError) as error:
        convert_criteo([write_tsv(tmp_path / "good", criteo_lines(30)), write_tsv(tmp_path / "bad", lines)], out,
                       CriteoSettings(ROWS))
    assert problems(error) == [f"{tmp_path / 'bad'} line 21: cat_4 is '12g4'; a category is 1 to 15 hex digits"]
    assert list(out.iterdir()) == []  # the first file, converted, is gone too; the directory stays


def test_bad_categories_are_named_beside_other_bad_lines_and_in_every_file(tmp_path):
    """Categories are read as the files are written: a bad label once hid every bad category, and a
    bad category every one in the files after it."""
    lines = criteo_lines(12)
    lines[2] = "7" + lines[2][1:]  # label 7
    fields = lines[6].split("\t")
    fields[14] = "nothex!"
    lines[6] = "\t".join(fields)
    masked = write_tsv(tmp_path / "masked", lines)
    with pytest.raises(InputError) as error:
        convert_criteo([masked], tmp_path / "out", CriteoSettings(ROWS))
    assert problems(error) == [f"{masked} line 3: the label is '7'; a label is 0 or 1",
                               f"{masked} line 7: cat_0 is 'nothex!'; a category is 1 to 15 hex digits"]
    bad = []
    for name in ("first", "second"):
        lines = criteo_lines(12)
        fields = lines[4].split("\t")
        fields[15] = "xyz"
        lines[4] = "\t".join(fields)
        bad.append(write_tsv(tmp_path / name, lines))
    out = tmp_path / "out2"
    with pytest.raises(InputError) as error:
        convert_criteo(bad, out, CriteoSettings(ROWS))
    assert problems(error) == [f"{path} line 5: cat_1 is 'xyz'; a category is 1 to 15 hex digits" for path in bad]
    assert not out.exists()


def test_line_numbers_count_skipped_lines_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(criteo, "BLOCK_BYTES", 4096)  # about 20 lines a block
    lines = criteo_lines(200)
    lines[9] = "1\t2"
    fields = lines[149].split("\t")
    fields[13] = "1.5"
    lines[149] = "\t".join(fields)
    with pytest.raises(InputError) as error:
        convert_criteo([write_tsv(tmp_path / "day", lines)], tmp_path / "out", CriteoSettings(ROWS))
    assert [p.where for p in error.value.problems] == [f"{tmp_path / 'day'} line 10", f"{tmp_path / 'day'} line 150"]


def test_reading_stops_at_the_problem_limit(tmp_path):
    tsv = write_tsv(tmp_path / "day", ["1\t2\t3"] * 500)
    with pytest.raises(InputError) as error:
        convert_criteo([tsv, tsv], tmp_path / "out", CriteoSettings(ROWS))
    assert len(error.value.problems) == MAX_PROBLEMS
    assert "more problems" not in error.value.render()  # one screen: the same reason shares a line


def test_missing_files_and_a_used_out_directory_are_named_before_reading(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.parquet").write_bytes(b"")
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(InputError) as error:
        convert_criteo([tmp_path / "nothing", tmp_path, tmp_path / "empty"], out, CriteoSettings(ROWS))
    assert problems(error) == [
        f"--out {out}: is not empty: give a new or empty directory (nothing in it is overwritten)",
        f"{tmp_path / 'nothing'}: cannot be read: No such file or directory",
        f"{tmp_path}: is a directory; give the TSV files themselves",
        f"{tmp_path / 'empty'}: is empty",
    ]
    assert [p.name for p in out.iterdir()] == ["old.parquet"]


def test_a_truncated_gzip_is_named(tmp_path):
    data = gzip.compress(("\n".join(criteo_lines(400)) + "\n").encode())
    tsv = tmp_path / "day.gz"
    tsv.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as error:
        convert_criteo([tsv], tmp_path / "out", CriteoSettings(ROWS))
    [problem] = error.value.problems
    # cut inside its first block of lines: nothing was read whole, so no line is named
    assert problem.where == str(tsv) and problem.reason == "cannot be read: 'Truncated compressed stream'"
    assert not (tmp_path / "out").exists()
