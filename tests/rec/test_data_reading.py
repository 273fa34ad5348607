"""Training data as the ranks read it: found as a file, a directory, a glob or a URI; split by row
groups over the ranks, each row once per epoch, its values exactly the file's; bad values and
types named with the column, how many and an example row; ids out of range stopped or mapped."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rec.data.files import open_data
from rec.data.ids import IdsPolicy, hash64, map_ids
from rec.data.layout import DataLayout
from rec.data.order import Position
from rec.data.parquet import ParquetSource
from rec.data.schema import data_problems
from rec.errors import InputError
from rec.spec import spec_from_rows

SPEC = spec_from_rows([
    dict(name="a", num_embeddings=1000, embedding_dim=8, feature_names=["row"]),  # the row's number, as its id
    dict(name="b", num_embeddings=50, embedding_dim=8, feature_names=["b1", "b2"], pooling_factor=2.0),
])
LAYOUT = DataLayout.of_spec(SPEC, 3)


def table(rows: range, rng: np.random.Generator) -> pa.Table:
    n = len(rows)
    bags = [list(rng.integers(0, 50, rng.integers(0, 4))) for _ in rows]
    return pa.table({
        "label": pa.array((np.array(rows) % 3 == 0).astype(np.int8)),
        "dense": pa.array([[float(r), r / 2, -r] for r in rows], pa.list_(pa.float64())),
        "row": pa.array([[r] for r in rows], pa.list_(pa.int32())),
        "b1": pa.array([b or None for b in bags], pa.list_(pa.int64())),  # an empty bag written as null
        "b2": pa.array([[1, 2][: r % 3] for r in rows], pa.large_list(pa.int64())),
        "other": pa.array(["ignored"] * n),
    })


@pytest.fixture
def dataset(tmp_path):
    """1000 rows in 4 files of uneven row groups, and in a directory with files the reader skips."""
    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    (root / "part=1").mkdir(parents=True)
    bounds = [0, 130, 400, 401, 1000]
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        pq.write_table(table(range(a, b), rng), root / f"part=1/f{i}.parquet", row_group_size=97)
    (root / "_SUCCESS").write_text("")
    (root / ".f0.parquet.crc").write_text("")
    return root


def test_a_directory_a_glob_a_file_and_a_uri_name_the_files_in_path_order(dataset):
    files = open_data(str(dataset))
    assert [p.rsplit("/", 1)[1] for p in files.paths] == ["f0.parquet", "f1.parquet", "f2.parquet", "f3.parquet"]
    assert files.rows == 1000 and sum(g.rows for g in files.row_groups) == 1000
    assert open_data(f"{dataset}/*/f[12].parquet").paths == files.paths[1:3]
    assert open_data(f"{dataset}/**/*.parquet").paths == files.paths
    with pytest.raises(InputError, match="nothing it matches"):  # as in the shell, * stays in its directory
        open_data(f"{dataset}/*.parquet")
    assert open_data(f"file://{dataset}/part=1/f0.parquet").rows == 130
    assert open_data(str(dataset)).fingerprint == files.fingerprint
    (dataset / "exp[1]").mkdir()
    (dataset / "part=1/f0.parquet").rename(dataset / "exp[1]/f0.parquet")
    assert open_data(f"{dataset}/exp[1]").rows == 130  # a path that exists, brackets and all
    assert open_data(f"{dataset}/exp[1]/f0.parquet").rows == 130


def test_a_relative_glob_matches_from_the_working_directory_as_the_shells_does(dataset, monkeypatch):
    """A glob whose first component has a wildcard once lost that component's first character:
    ``o*.parquet`` also read ``day1.parquet``, and ``*.parquet`` matched nothing."""
    monkeypatch.chdir(dataset / "part=1")
    (dataset / "part=1/f0.parquet").rename(dataset / "part=1/of0.parquet")
    assert [p.rsplit("/", 1)[1] for p in open_data("o*.parquet").paths] == ["of0.parquet"]
    assert len(open_data("*.parquet").paths) == 4
    assert [p.rsplit("/", 1)[1] for p in open_data("f[12].parquet").paths] == ["f1.parquet", "f2.parquet"]
    monkeypatch.chdir(dataset)
    assert len(open_data("*/f*.parquet").paths) == 3


def test_a_link_to_the_datas_own_folder_or_to_a_file_in_it_reads_each_file_once(dataset):
    """A link that loops back to the data's folder is followed again and again by a recursive listing,
    and a file linked beside itself would be listed twice: every row is read once all the same."""
    (dataset / "part=1" / "again").symlink_to(dataset)
    (dataset / "f0-link.parquet").symlink_to(dataset / "part=1" / "f0.parquet")
    (dataset / "f1-hard.parquet").hardlink_to(dataset / "part=1" / "f1.parquet")  # realpath does not see it
    files = open_data(str(dataset))
    assert files.rows == 1000 and len(files.paths) == 4


def test_a_file_rewritten_with_the_same_row_groups_is_told_apart_by_its_stamp(dataset):
    """Its rows in another order, its row counts the same: a resume would read on from a position
    that no longer means the same rows. The fingerprint of paths and counts alone did not change."""
    import os

    before = open_data(str(dataset))
    path = dataset / "part=1" / "f1.parquet"
    rows = pq.read_table(path)
    pq.write_table(rows.take(list(reversed(range(rows.num_rows)))), path, row_group_size=97)
    os.utime(path, ns=(1, 1))  # a rewrite within the clock's resolution: the size and time differ all the same
    after = open_data(str(dataset))
    assert after.fingerprint == before.fingerprint and after.stamp != before.stamp


def test_files_of_different_types_training_reads_are_read_as_one_dataset(tmp_path):
    first = table(range(0, 300), np.random.default_rng(0))
    second = table(range(300, 600), np.random.default_rng(1))
    second = pa.table({"label": second["label"].cast(pa.float64()),  # int8 labels beside float ones
                       "dense": second["dense"].cast(pa.list_(pa.float32())),
                       "row": second["row"].cast(pa.list_(pa.int64())),  # list<int32> ids beside list<int64>
                       "b1": second["b1"], "b2": second["b2"]})
    third = table(range(600, 700), np.random.default_rng(2))
    third = third.set_column(0, "label", pa.array(np.arange(600, 700) % 3 == 0))  # bool labels
    third = third.cast(pa.schema([f.with_nullable(False) if f.name != "b1" else f for f in third.schema]))
    fourth = table(range(700, 800), np.random.default_rng(3))
    fourth = fourth.set_column(0, "label", fourth["label"].cast(pa.decimal128(5, 2)))  # a warehouse's NUMERIC
    for i, t in enumerate((first, second, third, fourth)):
        pq.write_table(t, tmp_path / f"f{i}.parquet", row_group_size=128)
    assert data_problems(str(tmp_path), LAYOUT, IdsPolicy.ERROR) == []
    source = ParquetSource.open(open_data(str(tmp_path)), LAYOUT, shuffle=False, window=256)
    rows = np.concatenate([c.ids[0] for c in source.share(0, 1)])
    assert list(rows) == list(range(800))
    read = next(source.batches(Position(1), 0, 800))
    assert np.array_equal(read.labels, (read.ids[0] % 3 == 0).astype(np.float32))
    assert np.array_equal(read.dense[:, 0], read.ids[0].astype(np.float32))


def test_a_dense_width_that_one_file_of_several_gets_wrong_is_named_once_with_its_file(tmp_path):
    """The sample met the file's type again: one line read "--data column 'dense' of FILE, --data column
    'dense': holds 4 values per row"."""
    rows = table(range(0, 100), np.random.default_rng(0))
    for name, width in (("a", 3), ("b", 4)):
        dense = pa.array([[1.0] * width] * 100, pa.list_(pa.float32(), width))
        pq.write_table(rows.set_column(rows.schema.get_field_index("dense"), "dense", dense),
                       tmp_path / f"{name}.parquet")
    (problem,) = data_problems(str(tmp_path), LAYOUT, IdsPolicy.ERROR)
    assert problem.where == f"--data column 'dense' of {tmp_path / 'b.parquet'}"
    assert problem.reason == "holds 4 values per row; --dense-in-features is 3"


def test_every_files_problems_are_named_at_once_whatever_another_file_holds(tmp_path):
    """A file that is no Parquet hid every other problem, and a file of a wrong type or a missing
    column hid the bad values of the others: a user learned of them one run at a time."""
    rows = table(range(0, 100), np.random.default_rng(0))
    pq.write_table(rows.set_column(0, "label", pa.array(["0"] * 100)), tmp_path / "a.parquet")
    pq.write_table(rows.drop_columns(["b2"]), tmp_path / "b.parquet")
    (tmp_path / "c.parquet").write_text("not parquet")
    ids = rows.column("row").to_pylist()
    ids[7] = [5000]
    pq.write_table(rows.set_column(rows.schema.get_field_index("row"), "row", pa.array(ids, pa.list_(pa.int32()))),
                   tmp_path / "d.parquet")
    found = {p.where: p.reason for p in data_problems(str(tmp_path), LAYOUT, IdsPolicy.ERROR)}
    assert found.keys() == {f"--data {tmp_path / 'c.parquet'}", f"--data column 'label' of {tmp_path / 'a.parquet'}",
                            f"--data {tmp_path / 'b.parquet'}", "--data column 'row'"}
    assert "cannot read it as Parquet" in found[f"--data {tmp_path / 'c.parquet'}"]
    assert "has no column 'b2'" in found[f"--data {tmp_path / 'b.parquet'}"]
    assert f"first 5000 at row 7 of {tmp_path / 'd.parquet'}" in found["--data column 'row'"]
    for name in ("a", "b", "d"):
        (tmp_path / f"{name}.parquet").unlink()
    with pytest.raises(InputError, match="cannot read it as Parquet"):  # no file left to read: that one's problem
        open_data(str(tmp_path), unreadable=[])


def test_non_finite_dense_a_repeated_column_and_fewer_rows_than_ranks_are_named(tmp_path):
    rows = table(range(0, 20), np.random.default_rng(0))
    dense = [[float(r), 0.0, 0.0] for r in range(20)]
    dense[7][1] = float("nan")
    pq.write_table(rows.set_column(1, "dense", pa.array(dense)), tmp_path / "nan.parquet")
    (problem,) = data_problems(str(tmp_path / "nan.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert problem.where == "--data column 'dense'"
    assert problem.reason.startswith("1 value not finite as float32") and "first nan at row 7 of" in problem.reason
    pq.write_table(rows.append_column("row", rows["row"]), tmp_path / "twice.parquet")
    (problem,) = data_problems(str(tmp_path / "twice.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert problem.reason == "holds column 'row' more than once: name each column once"
    pq.write_table(rows.slice(0, 2), tmp_path / "two.parquet")
    (problem,) = data_problems(str(tmp_path / "two.parquet"), LAYOUT, IdsPolicy.ERROR, ranks=3)
    assert "holds 2 rows, fewer than the 3 ranks" in problem.reason
    big = rows.set_column(2, "row", pa.array([[2**63 + 5]] * 20, pa.list_(pa.uint64())))
    pq.write_table(big, tmp_path / "u64.parquet")
    (problem,) = data_problems(str(tmp_path / "u64.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert f"first {2**63 + 5} at row 0 of" in problem.reason  # the file's value, not its bits as int64


def test_nothing_to_read_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.parquet").write_text("not parquet")
    for source, reason in ((tmp_path / "nope", "no such file or directory"),
                           (tmp_path / "empty", "holds no Parquet file"),
                           (f"{tmp_path}/*.pq", "nothing it matches is a Parquet file"),
                           (tmp_path / "x.parquet", "cannot read it as Parquet")):
        with pytest.raises(InputError, match=reason):
            open_data(str(source))


@pytest.mark.parametrize("world", [1, 3])
def test_ranks_read_every_row_once_with_its_values(dataset, world):
    source = ParquetSource.open(open_data(str(dataset)), LAYOUT, seed=1, window=64)
    share = source.order.share_rows(Position(world))
    seen = []
    for rank in range(world):
        batch = next(source.batches(Position(world), rank, share))
        assert len(batch) == share
        rows = batch.ids[0]
        assert np.array_equal(batch.lengths[0], np.ones(share))  # one id per row: the row number
        assert np.array_equal(batch.labels, (rows % 3 == 0).astype(np.float32))
        assert np.array_equal(batch.dense, np.stack([rows, rows / 2, -rows], axis=1).astype(np.float32))
        assert np.array_equal(batch.lengths[2], rows % 3)  # b2: the first (row % 3) of [1, 2]
        seen += list(rows)
    assert len(seen) == len(set(seen)) and 1000 - len(seen) < world


def test_a_batch_spans_the_end_of_an_epoch_and_the_next_epoch_reads_every_row_again(dataset):
    source = ParquetSource.open(open_data(str(dataset)), LAYOUT, seed=2, window=100)
    batches = source.batches(Position(2), 1, 300)
    rows = np.concatenate([next(batches).ids[0] for _ in range(5)])  # 1500 rows of a 500-row share
    assert all(len(set(rows[e * 500:(e + 1) * 500])) == 500 for e in range(3))  # each epoch: 500 rows once
    other = source.batches(Position(2, epoch=1), 0, 500)
    assert sorted({*rows[500:1000], *next(other).ids[0]}) == list(range(1000))  # epoch 1: every row
    later = source.batches(source.advance(Position(2), 700), 1, 100)
    assert list(next(later).ids[0]) == list(rows[700:800])


def test_several_reader_threads_read_the_same_rows_in_the_same_order(dataset):
    files = open_data(str(dataset))
    one, four = (ParquetSource.open(files, LAYOUT, seed=3, window=50, threads=t) for t in (1, 4))
    start = one.advance(Position(2), 130)
    for a, b in itertools.islice(zip(one.batches(start, 1, 77), four.batches(start, 1, 77), strict=True), 20):
        assert np.array_equal(a.ids[0], b.ids[0]) and np.array_equal(a.dense, b.dense)  # across two epochs
    shares = [np.concatenate([c.ids[0] for c in s.share(0, 1)]) for s in (one, four)]
    assert np.array_equal(shares[0], shares[1]) and list(shares[0]) == list(range(1000))


def test_every_kind_of_bad_value_is_named_with_its_column_count_and_first_row(tmp_path):
    n = 40
    bad = pa.table({
        "label": pa.array([1.0] * 10 + [None] * 5 + [2.0] + [0.0] * 24),
        "dense": pa.array([[1.0, 2.0, 3.0]] * 39 + [[1.0]]),
        "row": pa.array([[i] for i in range(n - 1)] + [[5000]], pa.list_(pa.int64())),
        "b1": pa.array([[1, None]] + [[1]] * (n - 1), pa.list_(pa.int64())),
        "b2": pa.array([[-3]] * n, pa.list_(pa.int64())),
    })
    pq.write_table(bad, tmp_path / "bad.parquet")
    found = data_problems(str(tmp_path / "bad.parquet"), LAYOUT, IdsPolicy.ERROR)
    problems = {p.where: p.reason for p in found if "not 0 or 1" not in p.reason}
    assert set(problems) == {f"--data column {c!r}" for c in ("label", "dense", "row", "b1", "b2")}
    assert problems["--data column 'label'"].startswith("5 null labels in 40 rows read, first at row 10 of ")
    assert any(p.reason.startswith("1 label not 0 or 1 in 40 rows read, first 2 at row 15") for p in found)
    assert "1 of 40 rows read do not hold 3 values" in problems["--data column 'dense'"]
    assert "first 5000 at row 39 of" in problems["--data column 'row'"]
    assert "1 null id in 40 rows read" in problems["--data column 'b1'"]
    assert problems["--data column 'b2'"].startswith("40 ids outside [0, 50) (the rows of table b) in 40 rows read")
    # mapped instead, the ids are no problem
    mapped = data_problems(str(tmp_path / "bad.parquet"), LAYOUT, IdsPolicy.MODULO)
    assert {p.where for p in mapped} == {"--data column 'label'", "--data column 'dense'", "--data column 'b1'"}


@pytest.mark.parametrize("change", ["replaced", "truncated"])
def test_a_file_changed_after_its_footer_was_read_is_bad_input_naming_it(dataset, change):
    """A rank reading a file changed since training started (another Parquet file copied over it, or
    one cut short) stops as on bad input, naming the file, where Arrow's own error once made it exit 1
    (a retry) with raw bytes in the message."""
    from rec.data.row_groups import RowGroups

    files = open_data(str(dataset))
    path = dataset / "part=1" / "f3.parquet"
    if change == "replaced":
        pq.write_table(table(range(0, 3), np.random.default_rng(5)), path)
    else:
        path.write_bytes(path.read_bytes()[:300])
    groups = RowGroups(files, LAYOUT.columns, 2)
    last = len(files.row_groups) - 1
    with pytest.raises(InputError) as e:
        groups.get(last)
    assert [p.where for p in e.value.problems] == [str(path)]
    assert "the file is damaged, or was changed or replaced since it was opened" in e.value.render()
    assert all(line.isprintable() for line in e.value.render().splitlines())


def test_a_column_with_nulls_is_still_checked_for_its_other_bad_values(tmp_path):
    """Nulls once hid every other bad value of their column: a second run named them."""
    n = 40
    nan = float("nan")
    pq.write_table(pa.table({
        "label": pa.array([None] + [3.0] * (n - 1)),
        "dense": pa.array([None] + [[nan, 1.0, 2.0]] * (n - 1), pa.list_(pa.float64())),
        "row": pa.array([[None]] + [[10**7]] * (n - 1), pa.list_(pa.int64())),
        "b1": pa.array([[1]] * n, pa.list_(pa.int64())), "b2": pa.array([[1]] * n, pa.list_(pa.int64())),
    }), tmp_path / "bad.parquet")
    found: dict[str, list[str]] = {}
    for p in data_problems(str(tmp_path / "bad.parquet"), LAYOUT, IdsPolicy.ERROR):
        found.setdefault(p.where.removeprefix("--data column "), []).append(p.reason.split(" in ")[0])
    assert found == {"'label'": ["1 null label", "39 labels not 0 or 1"],
                     "'dense'": ["1 null row", "39 values not finite as float32 (NaN, infinite, or beyond +-3.4e38)"],
                     "'row'": ["1 null id", "39 ids outside [0, 1,000) (the rows of table a)"]}


def test_a_dense_row_of_the_wrong_width_hides_none_of_the_columns_other_bad_values(tmp_path):
    """A row of 4 values once ended the column's check: its NaN and null values (rows 2 and 5) were
    named only on a second run, after the width was fixed."""
    nan = float("nan")
    dense = [[0.0, 1.0, 2.0]] * 8
    dense[2], dense[3], dense[5] = [1.0, nan, 2.0], [1.0, 2.0, 3.0, 4.0], [None, 1.0, 2.0]
    ids = pa.array([[1]] * 8, pa.list_(pa.int64()))
    pq.write_table(pa.table({"label": pa.array([0.0, 1.0] * 4), "dense": pa.array(dense, pa.list_(pa.float64())),
                             "row": ids, "b1": ids, "b2": ids}), tmp_path / "bad.parquet")
    found = [p.reason for p in data_problems(str(tmp_path / "bad.parquet"), LAYOUT, IdsPolicy.ERROR)]
    assert [r.split(" in ")[0] for r in found] == ["1 of 8 rows read do not hold 3 values (--dense-in-features), "
                                                   "first 4 at row 3 of " + str(tmp_path / "bad.parquet"),
                                                   "1 null value", "1 value not finite as float32 (NaN, infinite, "
                                                                   "or beyond +-3.4e38)"]
    assert "first at row 5 of" in found[1] and "first nan at row 2 of" in found[2]


def test_a_null_in_a_bool_label_and_labels_only_near_0_or_1_are_named(tmp_path):
    """The bool column's null once crashed the check (exit 1, which Prefect retries); 0.99999999 was
    rounded to a label of 1 by float32 before the check."""
    rows = table(range(6), np.random.default_rng(0))
    flagged = rows.set_column(0, "label", pa.array([True, None, False, True, False, True]))
    pq.write_table(flagged, tmp_path / "bool.parquet")
    (problem,) = data_problems(str(tmp_path / "bool.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert str(problem).startswith("--data column 'label': 1 null label in 6 rows read, first at row 1 of ")
    near = rows.set_column(0, "label", pa.array([0, 1 + 1e-9, 1, 0, 0.99999999, 1e-50], pa.float64()))
    pq.write_table(near, tmp_path / "near.parquet")
    (problem,) = data_problems(str(tmp_path / "near.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert problem.reason.startswith("3 labels not 0 or 1 in 6 rows read, first 1.000000001 at row 1 of ")


def test_features_named_as_the_label_or_the_dense_column_are_refused(tmp_path):
    """Their ids would be read from that column: the dense floats cut to ids, or a crash on labels."""
    from dataclasses import replace

    clash = DataLayout.of_spec(spec_from_rows([
        dict(name="a", num_embeddings=10, embedding_dim=8, feature_names=["dense"]),
        dict(name="label", num_embeddings=10, embedding_dim=8)]), 3)
    pq.write_table(table(range(4), np.random.default_rng(0)), tmp_path / "d.parquet")
    found = [str(p) for p in data_problems(str(tmp_path / "d.parquet"), clash, IdsPolicy.ERROR)]
    assert found == ["--data column 'label': would hold both the ids of feature 'label' (table label) and the "
                     "labels; rename the feature in the spec",
                     "--data column 'dense': would hold both the ids of feature 'dense' (table a) and the dense "
                     "features; rename the feature in the spec"]
    # prediction reads no label: only the dense column is in the way
    unlabelled = data_problems(str(tmp_path / "d.parquet"), replace(clash, labelled=False), IdsPolicy.ERROR)
    assert [p.where for p in unlabelled] == ["--data column 'dense'"]


def test_a_damaged_row_group_is_named_before_launch_and_by_the_sampler(tmp_path):
    """Its footer reads, its pages do not: the checks before launch and `spec stats` once raised Arrow's
    error (a traceback, exit 1)."""
    from rec.data.sample import read_sample

    path = tmp_path / "damaged.parquet"
    pq.write_table(table(range(200), np.random.default_rng(0)), path, compression="snappy")
    column = pq.ParquetFile(path).metadata.row_group(0).column(2)  # row: the ids
    data = bytearray(path.read_bytes())
    for i in range(column.data_page_offset + 8, column.data_page_offset + column.total_compressed_size):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    (problem,) = data_problems(str(path), LAYOUT, IdsPolicy.ERROR)
    assert problem.where == str(path) and problem.reason.startswith("row group 0 cannot be read (")
    assert problem.reason.endswith("the file is damaged, or was changed or replaced since it was opened")
    with pytest.raises(InputError) as refused:
        read_sample(str(path), ("row",), 100, seed=0)
    assert [p.reason for p in refused.value.problems] == [problem.reason]


def test_columns_of_the_wrong_type_or_missing_are_named_before_any_row_is_read(tmp_path):
    pq.write_table(pa.table({
        "label": ["yes", "no"], "dense": pa.array([[1, 2, 3]] * 2, pa.list_(pa.int64())),
        "row": [1, 2], "b1": pa.array([[1.5]] * 2), "b2": pa.array([["x"]] * 2)}), tmp_path / "t.parquet")
    problems = {p.where: p.reason for p in data_problems(str(tmp_path / "t.parquet"), LAYOUT, IdsPolicy.ERROR)}
    assert problems["--data column 'label'"] == "is string; a label is a number, 0 or 1"
    assert problems["--data column 'dense'"].startswith("is list<element: int64>; dense features are a list of 3")
    assert problems["--data column 'row'"].endswith("store one id per row as a list of one")
    assert problems["--data column 'b1'"].startswith("is list<element: double>")
    assert problems["--data column 'b2'"].startswith("is list<element: string>")
    pq.write_table(pa.table({"label": [1]}), tmp_path / "few.parquet")
    (missing,) = data_problems(str(tmp_path / "few.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert missing.reason.startswith("has no column 'dense', 'row', 'b1', 'b2'")
    # a misspelled column is named beside the one the spec needs (not a column of another feature)
    pq.write_table(pa.table({"label": [1], "dense": [[1.0, 2.0, 3.0]], "row": [[1]], "b1": [[1]], "b_2": [[1]]}),
                   tmp_path / "typo.parquet")
    (missing,) = data_problems(str(tmp_path / "typo.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert missing.reason.startswith("has no column 'b2' (the file has 'b_2') (the data needs")
    # dense features one column each, as Criteo's tables often hold them: not 'dense_9' as a misspelling
    pq.write_table(pa.table({"label": [1], **{f"dense_{i}": [1.0] for i in range(3)}, "row": [[1]], "b1": [[1]],
                             "b2": [[1]]}), tmp_path / "scalars.parquet")
    (missing,) = data_problems(str(tmp_path / "scalars.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert missing.reason.startswith("has no column 'dense' (the file has 3 columns 'dense_0' to 'dense_2' instead: "
                                     "'dense' is one column holding a list of values per row)")


def test_an_id_out_of_range_beyond_the_sample_stops_the_ranks_reading_as_bad_input(dataset, tmp_path):
    rows = table(range(0, 30_000), np.random.default_rng(1))
    ids = [[i % 1000] for i in range(30_000)]
    ids[25_000] = [10**6]
    pq.write_table(rows.set_column(2, "row", pa.array(ids, pa.list_(pa.int64()))), tmp_path / "late.parquet",
                   row_group_size=30_000)
    assert data_problems(str(tmp_path / "late.parquet"), LAYOUT, IdsPolicy.ERROR) == []  # the sample misses it
    source = ParquetSource.open(open_data(str(tmp_path / "late.parquet")), LAYOUT, shuffle=False, window=4096)
    with pytest.raises(InputError, match=r"column 'row'.*first 1000000 at row 25,000 of .*late.parquet"):
        for _ in source.batches(Position(1), 0, 1000):
            pass


def test_modulo_and_hash_map_every_id_into_range_with_a_fixed_hash():
    ids = np.array([-1, 0, 7, 49, 50, 2**40, -(2**63)], np.int64)
    assert list(map_ids(ids, 50, IdsPolicy.MODULO)) == [(2**64 - 1) % 50, 0, 7, 49, 0, 2**40 % 50, 2**63 % 50]
    hashed = map_ids(ids, 50, IdsPolicy.HASH)
    assert ((hashed >= 0) & (hashed < 50)).all()
    # splitmix64's finalizer, fixed: the same ids map to the same rows on every machine and version
    some = [0, 1, 2, 12345, -1, 2**62 + 3]
    assert [int(h) for h in hash64(np.array(some, np.int64))] == [splitmix64_finalizer(i % 2**64) for i in some]
    assert int(hash64(np.array([1], np.int64))[0]) == 0x5692161D100B05E5


def splitmix64_finalizer(z: int) -> int:
    """The reference, in Python integers."""
    mask = 2**64 - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_unscaled_dense_values_get_a_note_scaled_ones_none(tmp_path):
    """Raw counts (up to 1e5-1e6, as Criteo's) train far worse than their log: the launcher says so
    in one line before it starts, and trains all the same."""
    from rec.data.schema import data_findings

    rows = table(range(50), np.random.default_rng(0))
    pq.write_table(rows, tmp_path / "scaled.parquet")
    found = data_findings(str(tmp_path / "scaled.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert found.problems == [] and found.dense_note == ""
    counts = rows.set_column(1, "dense", pa.array([[float(r) * 1000, 1.0, 2.0] for r in range(50)]))
    pq.write_table(counts, tmp_path / "counts.parquet")
    found = data_findings(str(tmp_path / "counts.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert found.problems == [] and found.dense_note.startswith("note      --data: dense values up to 4.9e+04 in ")
    assert "log(1 + x)" in found.dense_note
    found = data_findings(str(tmp_path / "nowhere.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert found.problems and found.dense_note == ""  # the problem is named, and no note


def test_labels_of_one_class_get_a_note_before_launch(tmp_path):
    """Labels all 0 (or all 1) trained and "succeeded" without a word; evaluated, the AUC and NE were
    left out of the summary."""
    from rec.data.schema import data_findings

    rows = table(range(50), np.random.default_rng(0))
    pq.write_table(rows, tmp_path / "both.parquet")
    assert data_findings(str(tmp_path / "both.parquet"), LAYOUT, IdsPolicy.ERROR).label_note == ""
    zeros = rows.set_column(0, "label", pa.array([0.0] * 50, pa.float32()))
    pq.write_table(zeros, tmp_path / "zeros.parquet")
    found = data_findings(str(tmp_path / "zeros.parquet"), LAYOUT, IdsPolicy.ERROR)
    assert found.problems == [] and found.label_note == (
        f"note      --data: every label of {tmp_path / 'zeros.parquet'} is 0: the model can learn only that; give "
        "data of both classes")
    found = data_findings(str(tmp_path / "zeros.parquet"), LAYOUT, IdsPolicy.ERROR, "--eval-data", sample_rows=20)
    assert found.label_note.startswith("note      --eval-data: every label in a sample of ")
    assert found.label_note.endswith(" is 0: if every row's is, AUC and NE are undefined on one class")
