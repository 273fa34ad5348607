"""``shardflow spec stats``: measures the tables of a spec from Parquet data and writes the spec with
its statistics, in the format the output's extension names; bad data or flags exit 2, writing nothing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from flows.cli import main
from rec.spec import read_spec

SPEC = {"tables": [
    {"name": "users", "num_embeddings": 50, "embedding_dim": 8, "feature_names": ["user"], "pooling_factor": 9},
    {"name": "products", "num_embeddings": 200, "embedding_dim": 8, "feature_names": ["item", "clicked"]},
]}


def _data(tmp_path, columns: dict[str, pa.Array] | None = None, rows: int = 300):
    """Two Parquet files of ``rows`` rows in all: user (1 id per row, some out of range), item (0-3 ids),
    clicked (2 ids), and a label; ``columns`` replaces or adds columns."""
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for k in range(2):
        n = rows // 2
        table = {"label": pa.array(rng.integers(0, 2, n)),
                 "user": pa.array([[int(u)] for u in rng.integers(0, 55, n)], pa.list_(pa.int64())),
                 "item": pa.array([rng.integers(0, 200, rng.integers(0, 4)).tolist() for _ in range(n)],
                                  pa.list_(pa.int64())),
                 "clicked": pa.array([rng.integers(0, 200, 2).tolist() for _ in range(n)], pa.list_(pa.int64()))}
        table.update({name: column[k * n:(k + 1) * n] for name, column in (columns or {}).items()})
        pq.write_table(pa.table(table), data / f"part-{k}.parquet", row_group_size=50)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    return data, spec


@pytest.mark.parametrize("ext", ["parquet", "yaml", "csv"])
def test_stats_writes_the_measured_spec_in_the_format_of_its_extension(tmp_path, capsys, ext):
    data, spec = _data(tmp_path)
    out = tmp_path / f"measured.{ext}"
    assert main(["spec", "stats", str(data), "--spec", str(spec), "--out", str(out), "--batch-size", "32"]) == 0
    written = read_spec(out)
    users, products = written.tables
    assert users.stats_rows == products.stats_rows == 300 and users.stats_batch_size == 32
    assert users.pooling_factor == 1.0 and 0 < users.ids_out_of_range < 300  # ids 50..54 are outside
    assert 1.5 < products.pooling_factor < 2.0 and products.ids_out_of_range == 0  # (1.5 + 2) / 2 on average
    assert products.hit_rate_curve is not None and [f for f, _ in products.hit_rate_curve] == [0.01, 0.02, 0.05, 0.1,
                                                                                          0.2, 0.5]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sampled 300 of 300 rows (6 row groups)")
    assert lines[1].split() == ["table", "pooling_factor", "distinct/batch", "out", "of", "range", "hit@10%"]
    assert lines[3].split()[:4] == ["users", "9", "->", "1"]
    assert "1 table (users) sees ids outside their rows" in lines[5]
    assert lines[-1] == f"wrote {out}: 2 tables, hash {written.spec_hash}"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_a_sample_smaller_than_the_data_is_reproducible_with_its_seed(tmp_path, capsys):
    data, spec = _data(tmp_path)
    args = ["spec", "stats", str(data), "--spec", str(spec), "--sample-rows", "120", "--seed", "7"]
    assert main([*args, "--out", str(tmp_path / "a.json")]) == 0
    assert main([*args, "--out", str(tmp_path / "b.json")]) == 0
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    assert read_spec(tmp_path / "a.json").tables[0].stats_rows == 120
    assert "sampled 120 of 300 rows (3 row groups)" in capsys.readouterr().out


def test_a_missing_column_or_one_of_the_wrong_type_exits_2_and_writes_nothing(tmp_path, capsys):
    strings = pa.array([["a"]] * 300, pa.list_(pa.string()))
    data, spec = _data(tmp_path, {"clicked": strings})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(
        {"tables": [*SPEC["tables"], {"name": "ads", "num_embeddings": 10, "embedding_dim": 8}]}))
    out = tmp_path / "out.parquet"
    out.write_text("the previous file")
    assert main(["spec", "stats", str(data), "--spec", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "has no column 'ads'" in err
    assert "DATA column 'clicked': is list<element: string>" in err and "Traceback" not in err
    assert out.read_text() == "the previous file"


def test_null_ids_exit_2_naming_the_column_and_row(tmp_path, capsys):
    nulls = pa.array([[1, None]] + [[1]] * 299, pa.list_(pa.int64()))
    data, spec = _data(tmp_path, {"user": nulls})
    assert main(["spec", "stats", str(data), "--spec", str(spec), "--out", str(tmp_path / "o.yaml")]) == 2
    assert "column 'user': 1 null id" in capsys.readouterr().err
    assert not (tmp_path / "o.yaml").exists()


@pytest.mark.parametrize(("flags", "says"), [
    (["--sample-rows", "0"], "--sample-rows"), (["--batch-size", "0"], "--batch-size"),
    (["--out", "x.txt"], "unsupported extension"),
])
def test_bad_flags_exit_2(tmp_path, capsys, flags, says):
    data, spec = _data(tmp_path)
    args = ["spec", "stats", str(data), "--spec", str(spec), "--out", str(tmp_path / "o.yaml"), *flags]
    assert main(args) == 2
    assert says in capsys.readouterr().err


def test_the_summary_lists_twenty_tables_then_how_many_more(tmp_path, capsys):
    data, _ = _data(tmp_path)
    spec = tmp_path / "many.yaml"
    spec.write_text(yaml.safe_dump({"tables": [
        {"name": f"t{i}", "num_embeddings": 100, "embedding_dim": 8, "feature_names": ["user"], "module": f"m{i}"}
        for i in range(23)]}))
    assert main(["spec", "stats", str(data), "--spec", str(spec), "--out", str(tmp_path / "o.arrow")]) == 0
    out = capsys.readouterr().out
    assert "m19.t19" in out and "m20.t20" not in out and "... 3 more" in out
    assert len(read_spec(tmp_path / "o.arrow")) == 23
