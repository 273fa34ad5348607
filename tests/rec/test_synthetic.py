from __future__ import annotations

import statistics
import subprocess
import sys

import pytest

from rec.sharding import DataType, Pooling
from rec.spec import read_spec
from rec.spec.synthetic import CRITEO_1TB_ROWS, criteo_1tb_spec, issue2282_spec, mixed_spec, power_law_spec
from tests.paths import ROOT


@pytest.mark.parametrize(
    "make", [lambda s: issue2282_spec(50, seed=s), lambda s: power_law_spec(50, seed=s), lambda s: mixed_spec(seed=s)]
)
def test_generators_are_deterministic_per_seed(make):
    assert make(0) == make(0)
    assert make(0).spec_hash != make(1).spec_hash


def test_issue2282_shape():
    spec = issue2282_spec(500)
    assert len(spec) == 500
    assert all(4 <= t.embedding_dim <= 16 for t in spec.tables)
    assert all(2 <= t.num_embeddings <= 1000 for t in spec.tables)
    assert all(len(t.feature_names) == 1 and t.pooling_factor == 1.0 for t in spec.tables)
    assert {t.embedding_dim for t in spec.tables} == {4, 8, 12, 16}  # multiples of 4, as FBGEMM needs
    assert spec.names == sorted(spec.names)  # zero-padded names sort in generation order


def test_power_law_rows_are_mostly_small_with_a_few_huge_tables():
    spec = power_law_spec(1000)
    rows = [t.num_embeddings for t in spec.tables]
    assert min(rows) >= 1_000 and max(rows) <= 200_000_000
    assert statistics.median(rows) < 100_000
    assert sum(r > 10_000_000 for r in rows) >= 3
    assert {t.embedding_dim for t in spec.tables} == {16, 32, 64, 128, 256}
    assert all(1.0 <= t.pooling_factor <= 50.0 for t in spec.tables)


def test_criteo_1tb_tables():
    spec = criteo_1tb_spec()
    assert len(spec) == 26
    assert [t.num_embeddings for t in spec.tables] == list(CRITEO_1TB_ROWS)
    assert spec.names == [f"t_cat_{i}" for i in range(26)]
    assert [t.feature_names for t in spec.tables] == [(f"cat_{i}",) for i in range(26)]
    assert {t.embedding_dim for t in spec.tables} == {128}


def test_criteo_example_file_is_the_generator_output():
    assert read_spec(ROOT / "examples/specs/criteo_1tb.yaml") == criteo_1tb_spec()


def test_cpu_demo_csv_and_yaml_hold_the_same_tables():
    yaml_spec = read_spec(ROOT / "examples/specs/cpu_demo.yaml")
    assert read_spec(ROOT / "examples/specs/cpu_demo.csv") == yaml_spec
    assert 6 <= len(yaml_spec) <= 10
    assert all(100 <= t.num_embeddings <= 100_000 and 16 <= t.embedding_dim <= 64 for t in yaml_spec.tables)
    assert sum(t.pooling_factor > 1 for t in yaml_spec.tables) >= 2
    assert any(t.pooling is Pooling.MEAN for t in yaml_spec.tables)


def test_mixed_spec_is_heterogeneous():
    spec = mixed_spec()
    assert len(spec) == 150
    rows = [t.num_embeddings for t in spec.tables]
    assert sum(r > 100_000_000 for r in rows) == 3
    assert sum(r < 10_000 for r in rows) >= 50
    dims = {t.embedding_dim for t in spec.tables}
    assert min(dims) == 8 and max(dims) == 512
    assert sum(t.data_type is DataType.FP16 for t in spec.tables) == 2
    assert any(t.pooling is Pooling.MEAN for t in spec.tables)
    assert any(len(t.feature_names) > 1 for t in spec.tables)
    assert max(t.pooling_factor for t in spec.tables) > 50


def test_make_issue2282_script_writes_the_generator_spec(tmp_path):
    out = tmp_path / "issue.parquet"
    script = ROOT / "examples/make_issue2282.py"
    done = subprocess.run(
        [sys.executable, str(script), "--tables", "40", "--seed", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert read_spec(out) == issue2282_spec(40, seed=3)
    assert "wrote 40 tables" in done.stdout


def test_make_issue2282_script_refuses_an_unknown_format(tmp_path):
    script = ROOT / "examples/make_issue2282.py"
    done = subprocess.run(
        [sys.executable, str(script), "--tables", "4", "--out", str(tmp_path / "x.txt")], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "unsupported extension" in done.stderr and "Traceback" not in done.stderr
