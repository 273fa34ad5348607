"""``rec.data.stats`` and ``rec.data.sample`` against brute force, and the statistics columns of a
spec: every format holds them, specs without them hash as before, bad values are named."""

from __future__ import annotations

import math
import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rec.data.sample import pick_groups, read_sample
from rec.data.stats import spec_stats, table_stats, with_stats
from rec.errors import InputError
from rec.hashing import content_hash
from rec.hit_rates import CACHE_FRACTIONS
from rec.spec import read_spec, spec_from_rows, write_spec
from rec.spec.columnar import columnar_spec
from rec.spec.columns import STATS_COLUMNS, table_to_row
from rec.spec.hashing import SPEC_HASH_FORMAT
from rec.spec.types import TableSpec
from tests.paths import SPECS

STATS = {"stats_rows": 1000, "stats_batch_size": 64, "distinct_per_batch": 12.5, "ids_out_of_range": 3,
         "hit_rate_curve": [[0.01, 0.25], [0.1, 0.5], [0.5, 0.9]]}


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def brute_force(samples: list[list[list[int]]], rows: int, batch_size: int) -> dict[str, object]:
    """The statistics counted one id at a time: ``samples[s][f]`` is sample s's ids of feature f."""
    features = len(samples[0])
    every = [i for sample in samples for ids in sample for i in ids]
    batches = max(len(samples) // batch_size, 1)
    size = batch_size if len(samples) >= batch_size else len(samples)
    distinct = [len({i for sample in samples[b * size:(b + 1) * size] for ids in sample for i in ids})
                for b in range(batches)]
    inside = [i for i in every if 0 <= i < rows]
    ranked = sorted(Counter(inside).values(), reverse=True)
    curve = None
    if inside:
        curve = tuple((f, _round(sum(ranked[:math.floor(Fraction(str(f)) * rows)]) / len(inside)))
                      for f in CACHE_FRACTIONS)
    return {"pooling_factor": _round(len(every) / (len(samples) * features)) if every else None,
            "distinct_per_batch": _round(sum(distinct) / batches),
            "ids_out_of_range": len(every) - len(inside), "hit_rate_curve": curve,
            "batch_size": size}  # the batch the distinct ids were counted over


def measured(samples: list[list[list[int]]], rows: int, batch_size: int, parts: int = 1) -> dict[str, object]:
    features = len(samples[0])
    table = TableSpec("t", rows, 4, tuple(f"f{k}" for k in range(features)))
    lengths = [np.array([len(s[f]) for s in samples], np.int32) for f in range(features)]
    ids = [np.array([i for s in samples for i in s[f]], np.int64) for f in range(features)]
    split = [np.array_split(v, parts) for v in ids]  # as read: one part per row group
    s = table_stats(table, lengths, split, batch_size)
    return {"pooling_factor": s.pooling_factor, "distinct_per_batch": s.distinct_per_batch,
            "ids_out_of_range": s.ids_out_of_range, "hit_rate_curve": s.hit_rate_curve, "batch_size": s.batch_size}


@pytest.mark.parametrize(("rows", "low", "high"), [
    (50, -3, 60),  # a few rows: bincount, some ids out of range
    (10**6, 0, 10**6),  # rows beyond the ids: sorted (as 32-bit keys)
    (10**9, 0, 10**9),  # and as 64-bit keys
    (1000, -(2**62), 2**62),  # ids spread over 64 bits (hashed): numbered by rank first
])
@pytest.mark.parametrize("batch_size", [7, 500])  # full batches and a tail; fewer samples than a batch
def test_statistics_equal_a_brute_force_count(rows, low, high, batch_size):
    rng = random.Random(rows + batch_size)
    pool = [rng.randint(low, high) for _ in range(40)] + list(range(min(rows, 30)))  # repeats, in range too
    for features in (1, 3):
        samples = [[[rng.choice(pool) for _ in range(rng.randint(0, 4))] for _ in range(features)]
                   for _ in range(101)]
        assert measured(samples, rows, batch_size, parts=3) == brute_force(samples, rows, batch_size)


def test_a_table_without_ids_has_no_pooling_factor_or_curve_and_keeps_the_specs():
    samples = [[[]] for _ in range(10)]
    assert measured(samples, 100, 4) == {"pooling_factor": None, "distinct_per_batch": 0.0,
                                         "ids_out_of_range": 0, "hit_rate_curve": None, "batch_size": 4}
    spec = spec_from_rows([{"name": "t", "num_embeddings": 100, "embedding_dim": 4, "pooling_factor": 3.0}])
    stats = table_stats(spec.tables[0], [np.zeros(10, np.int32)], [[np.zeros(0, np.int64)]], 4)
    assert with_stats(spec, [stats]).tables[0].pooling_factor == 3.0


def test_the_hit_rate_curve_of_a_known_zipf_distribution():
    """Row r is looked up 1200 // (r + 1) times: a cache of the k most frequent rows serves
    sum(1200 // (r + 1) for r < k) of them, and rows never looked up count as zero."""
    rows = 400  # rows 200..399 never looked up
    counts = [1200 // (r + 1) for r in range(200)]
    ids = np.repeat(np.arange(200), counts)
    np.random.default_rng(0).shuffle(ids)
    lengths = np.ones(len(ids), np.int32)
    s = table_stats(TableSpec("z", rows, 4, ("z",)), [lengths], [[ids]], 64)
    total = sum(counts)
    cached = {0.01: 4, 0.02: 8, 0.05: 20, 0.1: 40, 0.2: 80, 0.5: 200}  # floor(fraction * 400) rows
    expected = tuple((f, _round(sum(counts[:cached[f]]) / total)) for f in CACHE_FRACTIONS)
    assert s.hit_rate_curve == expected
    assert s.hit_rate_curve[-1] == (0.5, 1.0)  # 200 rows cached: every row ever looked up
    assert s.pooling_factor == 1.0 and s.ids_out_of_range == 0


def _dataset(tmp_path, groups: int = 6, rows_per_group: int = 40, files: int = 2) -> list[list[list[int]]]:
    """Parquet files of ``groups`` row groups in all, columns a (list<int64>), b (list<int32>) and
    label (a string: never read); returns every sample's ids of a and b in path order."""
    rng = np.random.default_rng(1)
    samples = []
    per_file = groups // files
    for k in range(files):
        a = [rng.integers(-2, 30, rng.integers(0, 4)).tolist() for _ in range(per_file * rows_per_group)]
        b = [rng.integers(0, 1000, rng.integers(1, 3)).tolist() for _ in range(per_file * rows_per_group)]
        table = pa.table({"a": pa.array(a, pa.list_(pa.int64())), "b": pa.array(b, pa.list_(pa.int32())),
                          "label": pa.array(["x"] * len(a))})
        pq.write_table(table, tmp_path / f"part-{k}.parquet", row_group_size=rows_per_group)
        samples += [[x, y] for x, y in zip(a, b, strict=True)]
    return samples


def test_a_sample_is_whole_row_groups_chosen_with_the_seed_and_reads_only_the_feature_columns(tmp_path):
    samples = _dataset(tmp_path)
    sample = read_sample(str(tmp_path), ("a", "b"), 10**6, seed=0)  # more than the data holds: all of it
    assert sample.rows == sample.total_rows == 240 and sample.row_groups == 6
    assert sample.lengths["a"].tolist() == [len(s[0]) for s in samples]
    assert np.concatenate(sample.ids["b"]).tolist() == [i for s in samples for i in s[1]]

    part = read_sample(str(tmp_path), ("a",), 100, seed=3)
    assert part.rows == 100 and part.row_groups == 3  # two whole groups, and 20 rows of a third
    picks = pick_groups(_groups(tmp_path), 100, 3)
    assert [take for _, take in picks].count(40) == 2 and sum(t for _, t in picks) == 100
    assert picks == sorted(picks)  # read in path order
    assert pick_groups(_groups(tmp_path), 100, 3) == picks != pick_groups(_groups(tmp_path), 100, 4)


def _groups(tmp_path):
    from rec.data.files import open_data

    return open_data(str(tmp_path)).row_groups


def test_statistics_of_a_dataset_equal_a_brute_force_count(tmp_path):
    samples = _dataset(tmp_path)
    spec = spec_from_rows([{"name": "ab", "num_embeddings": 25, "embedding_dim": 4, "feature_names": ["a", "b"]},
                           {"name": "b_only", "num_embeddings": 2000, "embedding_dim": 4, "feature_names": ["b"],
                            "module": "tower"}])
    sample = read_sample(str(tmp_path), ("a", "b"), 10**6, seed=0)
    stats = spec_stats(spec, sample, batch_size=16)
    by_key = {s.key: s for s in stats}
    assert {k: getattr(by_key["ab"], k) for k in brute_force(samples, 25, 16)} == brute_force(samples, 25, 16)
    only_b = [[s[1]] for s in samples]
    assert {k: getattr(by_key["tower.b_only"], k) for k in brute_force(only_b, 2000, 16)} == \
        brute_force(only_b, 2000, 16)
    new = with_stats(spec, stats)
    assert new.tables[0].pooling_factor == by_key["ab"].pooling_factor
    assert new.tables[0].stats_rows == 240 and new.tables[0].stats_batch_size == 16


def test_a_missing_column_or_one_of_the_wrong_type_is_named(tmp_path):
    _dataset(tmp_path)
    with pytest.raises(InputError) as caught:
        read_sample(str(tmp_path), ("a", "nope", "label"), 100, seed=0)
    text = caught.value.render()
    assert "has no column 'nope'" in text and "column 'label'" in text and "list<int64>" in text


def test_a_column_of_the_wrong_type_hides_no_bad_ids_of_the_others(tmp_path):
    """The type of one column stopped the check before the others' ids were read: a null id was named
    only on the next run."""
    table = pa.table({"a": pa.array([[1], None, [2, None]], pa.list_(pa.int64())),
                      "label": pa.array(["x", "y", "z"])})
    pq.write_table(table, tmp_path / "bad.parquet")
    with pytest.raises(InputError) as caught:
        read_sample(str(tmp_path / "bad.parquet"), ("a", "label"), 100, seed=0)
    assert [p.where for p in caught.value.problems] == ["DATA column 'label'", "DATA column 'a'"]
    assert "1 null id in 3 rows read, first at row 2 of" in caught.value.problems[1].reason


# ---------------------------------------------------------------- the spec's columns


def _with_stats_rows() -> list[dict[str, object]]:
    return [{"name": "measured", "num_embeddings": 100, "embedding_dim": 8, **STATS},
            {"name": "plain", "num_embeddings": 100, "embedding_dim": 8},
            {"name": "curve_only", "num_embeddings": 10, "embedding_dim": 8, "hit_rate_curve": "0.5:1"}]


@pytest.mark.parametrize("ext", ["parquet", "arrow", "csv", "yaml", "json"])
def test_the_statistics_columns_round_trip_through_every_format(tmp_path, ext):
    spec = spec_from_rows(_with_stats_rows())
    assert spec.tables[0].hit_rate_curve == ((0.01, 0.25), (0.1, 0.5), (0.5, 0.9))
    assert spec.tables[2].hit_rate_curve == ((0.5, 1.0),) and spec.tables[1].stats_rows is None
    assert read_spec(write_spec(spec, tmp_path / f"s.{ext}")) == spec


def test_typed_files_with_statistics_take_the_column_by_column_path():
    spec = spec_from_rows(_with_stats_rows())
    rows = [table_to_row(t) for t in spec.tables]
    curve_type = pa.list_(pa.struct([("cache_fraction", pa.float64()), ("hit_rate", pa.float64())]))
    for row in rows:
        if "hit_rate_curve" in row:
            row["hit_rate_curve"] = [{"cache_fraction": f, "hit_rate": h} for f, h in row["hit_rate_curve"]]
    table = pa.Table.from_pylist(rows)
    assert table.schema.field("hit_rate_curve").type == curve_type
    assert columnar_spec(table) == spec


def test_the_statistics_hash_as_their_rows_and_specs_without_them_hash_as_before():
    spec = spec_from_rows(_with_stats_rows())
    assert spec.spec_hash == content_hash({"format": SPEC_HASH_FORMAT,
                                           "tables": sorted((table_to_row(t) for t in spec.tables),
                                                            key=lambda r: str(r["name"]))})
    plain = spec_from_rows([_with_stats_rows()[1]])
    assert not set(STATS_COLUMNS) & set(table_to_row(plain.tables[0]))
    # The bundled examples hash as they did before the statistics columns existed.
    assert read_spec(SPECS / "cpu_demo.yaml").spec_hash == "ad907aa97d087e3e"
    assert read_spec(SPECS / "criteo_1tb.yaml").spec_hash == "63e8897aa78ed19a"
    assert read_spec(SPECS / "two_tower_seq.yaml").spec_hash == "07f4e0f32bff5a22"
    for key, value in STATS.items():
        assert spec_from_rows([{**_with_stats_rows()[1], "stats_batch_size": 64, key: value}]).spec_hash != \
            plain.spec_hash


def test_a_spec_without_statistics_is_written_without_their_columns(tmp_path):
    write_spec(spec_from_rows([_with_stats_rows()[1]]), tmp_path / "plain.parquet")
    assert not set(STATS_COLUMNS) & set(pq.read_schema(tmp_path / "plain.parquet").names)


@pytest.mark.parametrize(("cell", "reason"), [
    ({"hit_rate_curve": [[0.1, 1.2]]}, "hit_rate_curve: point 1: hit_rate must be in [0, 1], got 1.2"),
    ({"hit_rate_curve": [[0, 0.1]]}, "hit_rate_curve: point 1: cache_fraction must be in (0, 1], got 0"),
    # the value as given: "got 1" read as a value in bounds
    ({"hit_rate_curve": [[0.5, 0.3], [1.0000000001, 0.9]]},
     "hit_rate_curve: point 2: cache_fraction must be in (0, 1], got 1.0000000001"),
    ({"hit_rate_curve": [[0.2, 0.3], [0.1, 0.4]]},
     "hit_rate_curve: point 2: cache fractions must increase, got 0.1 after 0.2"),
    ({"hit_rate_curve": "0.1:0.5;0.2:0.4"}, "hit_rate_curve: point 2: a larger cache cannot serve fewer lookups"),
    ({"hit_rate_curve": [[0.1]]}, "hit_rate_curve: point 1: expected a pair (cache_fraction, hit_rate)"),
    ({"hit_rate_curve": []}, "hit_rate_curve: must not be empty"),
    ({"ids_out_of_range": -1}, "ids_out_of_range: must be >= 0, got -1"),
    ({"distinct_per_batch": -0.5, "stats_batch_size": 8}, "distinct_per_batch: must be >= 0"),
    ({"distinct_per_batch": 4.0}, "distinct_per_batch needs stats_batch_size"),
    ({"stats_rows": 0}, "stats_rows: must be > 0"),
    ({"stats_batch_size": "many"}, "stats_batch_size: expected a positive integer"),
])
def test_bad_statistics_are_named_with_the_table(cell, reason):
    with pytest.raises(InputError) as caught:
        spec_from_rows([{"name": "ok", "num_embeddings": 10, "embedding_dim": 4},
                        {"name": "bad", "num_embeddings": 10, "embedding_dim": 4, **cell}])
    assert len(caught.value.problems) == 1
    assert str(caught.value.problems[0]).startswith(f"table 'bad': {reason}")


def test_bad_statistics_in_a_parquet_spec_are_named_too(tmp_path):
    rows = [{"name": "bad", "num_embeddings": 10, "embedding_dim": 4,
             "hit_rate_curve": [{"cache_fraction": 0.1, "hit_rate": 1.5}], "ids_out_of_range": -2}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    with pytest.raises(InputError) as caught:
        read_spec(tmp_path / "bad.parquet")
    assert [str(p) for p in caught.value.problems] == [
        "table 'bad': ids_out_of_range: must be >= 0, got -2",
        "table 'bad': hit_rate_curve: point 1: hit_rate must be in [0, 1], got 1.5"]
