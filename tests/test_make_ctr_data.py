"""examples/make_ctr_data.py: planted-signal click data in the training layout, with its best AUC."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from examples import make_ctr_data as ctr
from rec.data.ids import IdsPolicy
from rec.data.layout import DataLayout
from rec.data.schema import data_problems
from rec.spec import read_spec

SMALL = ctr.CtrSettings(tables=3, rows=50, dim=8, pooling=1.5, features_per_table=2, dense_in_features=5,
                        train_rows=1_000, eval_rows=300, files=3, rows_per_group=128, seed=7)


def _args(s: ctr.CtrSettings, out: Path) -> list[str]:
    return ["--out", str(out), *(arg for name, value in vars(s).items()
                                 for arg in (f"--{name.replace('_', '-')}", str(value)))]


def _brute_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels > 0.5][:, None], scores[labels < 0.5][None, :]
    return float(((pos > neg) + 0.5 * (pos == neg)).mean())


def _brute_expected_auc(p: np.ndarray) -> float:
    pi, pj = p[:, None], p[None, :]
    pairs = pi * (1 - pj) * ((pi > pj) + 0.5 * (pi == pj))
    np.fill_diagonal(pairs, 0.0)
    mass = pi * (1 - pj)
    np.fill_diagonal(mass, 0.0)
    return float(pairs.sum() / mass.sum())


def _truth_json(out: Path) -> object:
    return json.loads((out / "truth.json").read_text())


def test_main_writes_train_files_eval_spec_and_truth_in_the_training_layout(tmp_path, capsys):
    assert ctr.main(_args(SMALL, tmp_path)) == 0
    assert "Bayes AUC" in capsys.readouterr().out
    parts = [tmp_path / "train" / f"part-{i:05d}.parquet" for i in range(3)]
    assert sorted((tmp_path / "train").iterdir()) == parts
    names = [f"cat_{f}" for f in range(6)]
    for path, rows in [*zip(parts, (333, 333, 334), strict=True), (tmp_path / "eval.parquet", 300)]:
        meta = pq.ParquetFile(path).metadata
        assert meta.num_rows == rows
        assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [128, 128, rows - 256]
        schema = pq.read_schema(path)
        assert schema.names == ["label", "dense", *names]
        assert schema.field("label").type == pa.float32()
        assert schema.field("dense").type == pa.list_(pa.float32(), 5)
        assert all(schema.field(n).type == pa.list_(pa.int64()) for n in names)

    spec = read_spec(tmp_path / "spec.yaml")
    assert spec == ctr.table_spec(SMALL)
    assert [(t.name, t.num_embeddings, t.embedding_dim, t.feature_names, t.pooling_factor) for t in spec.tables] == [
        (f"table_{t}", 50, 8, (f"cat_{2 * t}", f"cat_{2 * t + 1}"), 1.5) for t in range(3)]
    layout = DataLayout.of_spec(spec, 5)
    for source in (tmp_path / "train", tmp_path / "eval.parquet"):
        assert data_problems(str(source), layout, IdsPolicy.ERROR) == []

    train = pq.read_table(tmp_path / "train")
    lengths = pc.list_value_length(train.column("cat_0")).to_numpy()
    assert (lengths == 0).any() and abs(lengths.mean() - 1.5) < 0.2  # Poisson bags, empty ones among them
    truth = _truth_json(tmp_path)
    assert isinstance(truth, dict)
    assert truth["settings"] == vars(SMALL) and truth["seed"] == 7 and truth["base_rate"] == 0.25
    assert truth["train"] == {"rows": 1_000, "files": [f"train/part-{i:05d}.parquet" for i in range(3)],
                              "base_rate": float(train.column("label").to_numpy().mean(dtype=np.float64))}
    assert {"bayes_auc_expected", "bayes_auc_empirical", "bayes_logloss", "bias"} <= truth.keys()


def test_rows_are_the_same_whatever_the_files_and_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(ctr, "CHUNK_ROWS", 100)  # several random streams within a file and a row group
    one = replace(SMALL, files=1, rows_per_group=10_000)
    ctr.generate(one, tmp_path / "one")
    ctr.generate(SMALL, tmp_path / "three")
    ctr.generate(replace(one, train_rows=250), tmp_path / "short")
    first = pq.read_table(tmp_path / "one" / "train.parquet")
    assert pq.ParquetFile(tmp_path / "one" / "train.parquet").metadata.num_row_groups == 1
    assert pq.read_table(tmp_path / "three" / "train").equals(first)
    assert pq.read_table(tmp_path / "short" / "train.parquet").equals(first.slice(0, 250))
    assert pq.read_table(tmp_path / "short" / "eval.parquet").equals(pq.read_table(tmp_path / "one" / "eval.parquet"))


def test_truth_agrees_with_brute_force_on_the_eval_rows(tmp_path):
    truth = ctr.generate(SMALL, tmp_path)
    table = pq.read_table(tmp_path / "eval.parquet")
    p = ctr.table_probabilities(ctr.planted_model(SMALL), SMALL, table)
    labels = table.column("label").to_numpy()
    assert set(np.unique(labels)) == {0.0, 1.0}
    assert _truth_json(tmp_path) == json.loads(json.dumps(truth.to_json()))
    assert truth.bayes_auc_expected == pytest.approx(_brute_expected_auc(p), rel=1e-12)
    assert truth.bayes_auc_empirical == pytest.approx(_brute_auc(p, labels), rel=1e-12)
    bce = -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    assert truth.bayes_logloss == pytest.approx(bce, rel=1e-12)
    assert truth.eval == ctr.Split(300, ("eval.parquet",), float(labels.mean(dtype=np.float64)))
    assert truth.eval_mean_p == pytest.approx(float(p.mean()), rel=1e-12)


def test_auc_counts_ties_as_half_like_the_pairwise_count():
    assert ctr.auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == 0.75
    assert ctr.auc(np.array([1.0, 1.0]), np.array([0, 1])) == 0.5
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 6, 300).astype(np.float64)  # many ties
    labels = (rng.random(300) < 0.3).astype(np.float32)
    assert ctr.auc(scores, labels) == pytest.approx(_brute_auc(scores, labels), rel=1e-12)
    with pytest.raises(ValueError, match="both labels"):
        ctr.auc(scores, np.zeros(300))


def test_expected_auc_with_tied_probabilities_matches_the_pairwise_sum():
    p = np.round(np.random.default_rng(4).beta(2, 5, 300), 1)
    assert ctr.expected_auc(p) == pytest.approx(_brute_expected_auc(p), rel=1e-12)


def test_expected_auc_is_the_mean_auc_over_label_draws():
    rng = np.random.default_rng(5)
    p = ctr.sigmoid(rng.normal(-1.2, 1.3, 300))
    draws = rng.random((4_000, 300)) < p
    aucs = np.array([ctr.auc(p, labels) for labels in draws])
    assert abs(aucs.mean() - ctr.expected_auc(p)) < 0.003  # Monte Carlo error ~0.0005, ratio bias O(1/n)


def test_the_planted_signal_is_real_and_near_its_expected_auc(tmp_path):
    s = replace(ctr.CtrSettings(), train_rows=2_000, eval_rows=20_000)
    truth = ctr.generate(s, tmp_path)
    assert 0.75 < truth.bayes_auc_expected < 0.85
    assert truth.bayes_auc_empirical is not None
    assert abs(truth.bayes_auc_empirical - truth.bayes_auc_expected) < 4 * truth.bayes_auc_stderr
    assert abs(truth.eval.base_rate - 0.25) < 0.02 and abs(truth.train.base_rate - 0.25) < 0.05
    assert truth.bayes_logloss < truth.constant_logloss
    assert truth.bayes_logloss_expected == pytest.approx(truth.bayes_logloss, abs=0.01)
    # Skewed ids: the hottest row of a table takes about its Zipf share of the draws.
    model = ctr.planted_model(s)
    ids = pq.read_table(tmp_path / "eval.parquet", columns=["cat_0"]).column("cat_0").combine_chunks().flatten()
    counts = np.bincount(ids.to_numpy(), minlength=s.rows)
    assert counts.argmax() == model.ranked_ids[0][0]
    assert counts.max() / counts.sum() == pytest.approx(model.cdf[0], abs=0.02)


def test_main_refuses_bad_settings_naming_each_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert ctr.main(["--out", str(out), "--dim", "6", "--tables", "0", "--dense-dist", "cauchy"]) == 2
    err = capsys.readouterr().err
    assert "--dim" in err and "--tables" in err and "--dense-dist" in err and "Traceback" not in err
    assert not out.exists()
