"""``shardflow data criteo``: Criteo logs to training data a plan can train on, or one screen of problems."""

from __future__ import annotations

import gzip

import pyarrow as pa
import pyarrow.parquet as pq

from flows.reports import command
from rec.data.criteo import CAT_NAMES
from rec.data.ids import IdsPolicy
from rec.data.layout import DataLayout
from rec.data.schema import data_problems
from rec.spec import read_spec
from tests.flows.cli_in_process import shardflow_here

LINE = "\t".join(["1", "5", "", "-2", *["7"] * 10, *["68fd1e64"] * 25, ""])


def test_converts_logs_into_data_and_spec_that_training_accepts(tmp_path, capfd):
    plain = tmp_path / "day_0"
    plain.write_text("\n".join([LINE] * 30) + "\n")
    zipped = tmp_path / "day_1.gz"
    zipped.write_bytes(gzip.compress(("\n".join([LINE.replace("1", "0", 1)] * 20) + "\n").encode()))
    out = tmp_path / "criteo"

    result = shardflow_here(capfd, "data", "criteo", str(plain), str(zipped), "--out", str(out),
                            "--rows-per-table", "1000", "--rows-per-group", "16")

    assert result.returncode == 0, result.stderr
    assert f"{plain} -> {out}/part-00000.parquet: 30 rows (smallest integer -2)" in result.stdout
    assert f"{zipped} -> {out}/part-00001.parquet: 20 rows (smallest integer -2)" in result.stdout
    assert f"wrote 50 rows in 2 files to {out}" in result.stdout
    shardflow = command("shardflow")  # as typed here: .venv/bin/shardflow where the venv is not activated
    assert f"\n  {shardflow} plan {out}/spec.yaml --topology" in result.stdout
    assert f"\n  {shardflow} train --plan PLAN_DIR --data {out} --dense-in-features 13" in result.stdout
    schema = pq.read_schema(out / "part-00000.parquet")
    assert schema.field("label").type == pa.float32()
    assert schema.field("dense").type == pa.list_(pa.float32(), 13)
    assert all(schema.field(c).type == pa.list_(pa.int64()) for c in CAT_NAMES)
    spec = read_spec(out / "spec.yaml")
    features = [f for t in spec.tables for f in t.feature_names]
    assert features == list(CAT_NAMES) == schema.names[2:]
    assert {(t.num_embeddings, t.embedding_dim, t.pooling_factor) for t in spec.tables} == {(1000, 64, 1.0)}
    # The check training runs before launch finds nothing wrong with the data for this spec.
    assert data_problems(str(out), DataLayout.of_spec(spec, 13), IdsPolicy.ERROR) == []
    first = pq.read_table(out / "part-00000.parquet").slice(0, 1).to_pylist()[0]
    assert first["label"] == 1.0 and first["cat_0"] == [0x68FD1E64 % 1000] and first["cat_25"] == [0]


def test_bad_lines_exit_2_with_one_screen_naming_them(tmp_path, capfd):
    tsv = tmp_path / "day_0"
    tsv.write_text("\n".join([LINE, "1\t2\t3", LINE.replace("-2", "abc")]) + "\n")
    out = tmp_path / "criteo"

    result = shardflow_here(capfd, "data", "criteo", str(tsv), "--out", str(out), "--rows-per-table", "10")

    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "shardflow: Cannot convert the Criteo logs:",
        f"  - {tsv} line 2: has 3 fields; a Criteo line has 40 tab-separated fields (label, 13 integers, "
        "26 categories)",
        f"  - {tsv} line 3: int_2 is 'abc'; an integer field holds an optional '-' and digits, "
        "within 64 bits (+-9.2e18)",
    ]
    assert result.stdout == ""
    assert not out.exists()


def test_bad_settings_exit_2_before_reading(tmp_path, capfd):
    result = shardflow_here(capfd, "data", "criteo", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                            "--rows-per-table", "0", "--embedding-dim", "6")
    assert result.returncode == 2
    assert "--rows-per-table: must be at least 1, got 0" in result.stderr
    assert "--embedding-dim: must be a multiple of 4" in result.stderr
    assert "Traceback" not in result.stderr

    missing = shardflow_here(capfd, "data", "criteo", str(tmp_path / "none"), "--out", str(tmp_path / "o"))
    assert missing.returncode == 2 and "--rows-per-table" in missing.stderr


def test_sigterm_while_converting_exits_143_in_one_line_and_leaves_nothing_half_written(tmp_path):
    """A SIGTERM (or SIGHUP) once killed the converter mid-file: its .tmp part stayed, and a rerun into
    the same --out was refused as not empty."""
    import os
    import signal
    import subprocess
    import time

    from tests.paths import SHARDFLOW

    tsv, out = tmp_path / "day_0", tmp_path / "out"
    tsv.write_text((LINE + "\n") * 200_000)
    converting = subprocess.Popen([SHARDFLOW, "data", "criteo", str(tsv), "--out", str(out), "--rows-per-table",
                                   "1000"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out.is_dir() and any(n.endswith(".tmp") for n in os.listdir(out))):
        assert converting.poll() is None and time.monotonic() < deadline, "the conversion ended before a part"
        time.sleep(0.02)
    converting.send_signal(signal.SIGTERM)
    _, err = converting.communicate(timeout=60)
    assert converting.returncode == 128 + signal.SIGTERM
    *progress, last = err.splitlines()  # a slow conversion prints its progress lines first
    assert last == "shardflow: stopped by SIGTERM; nothing half written is left"
    # on a busy machine the check of the file before it is converted is slow enough for one too
    assert all(line.startswith(("convert: 1 Criteo file", "convert: checking day_0")) for line in progress), err
    assert not out.exists() or not [n for n in os.listdir(out) if n.endswith(".tmp")]
