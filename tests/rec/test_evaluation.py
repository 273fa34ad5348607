"""Evaluation metrics, exact: AUC against a brute force over every pair (ties counted half) and
scikit-learn; logloss and normalized entropy against their definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rec.evaluation.auc import auc
from rec.evaluation.logloss import base_entropy, logloss
from rec.evaluation.metrics import METRICS, evaluate


def pairwise_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    neg = [s for s, y in zip(scores, labels, strict=True) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(6))
def test_auc_equals_the_share_of_positive_negative_pairs_ranked_right_ties_half(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    labels = (rng.random(n) < rng.uniform(0.05, 0.95)).astype(np.float64)
    labels[:2] = [0, 1]
    scores = np.round(rng.normal(labels * rng.uniform(0, 2), 1.0), int(rng.integers(0, 3)))  # many ties
    assert auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels), abs=1e-12)


def test_auc_agrees_with_scikit_learn_on_a_large_set_and_is_undefined_with_one_class():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(7)
    labels = (rng.random(200_000) < 0.2).astype(np.float64)
    scores = rng.normal(labels, 1.0).astype(np.float32)
    assert auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert auc(scores, np.ones_like(labels)) is None
    assert auc(np.zeros(0), np.zeros(0)) is None


def test_logloss_from_logits_matches_the_definition_and_stays_finite_when_confident():
    from sklearn.metrics import log_loss

    rng = np.random.default_rng(3)
    logits = rng.normal(0, 3, 10_000)
    labels = (rng.random(10_000) < 1 / (1 + np.exp(-logits))).astype(np.float64)
    p = 1 / (1 + np.exp(-logits))
    assert logloss(logits, labels) == pytest.approx(log_loss(labels, p), rel=1e-9)
    assert np.isfinite(logloss(np.array([800.0, -800.0]), np.array([0.0, 1.0])))


def test_normalized_entropy_is_one_for_the_base_rate_and_below_for_a_better_model():
    labels = np.array([1, 0, 0, 0] * 250, np.float64)
    rate = np.full(len(labels), np.log(0.25 / 0.75))  # always the click rate, as a logit
    result = evaluate(rate, labels, iteration=7)
    assert result.values["ne"] == pytest.approx(1.0) and result.values["auc"] == 0.5
    assert result.values["logloss"] == pytest.approx(base_entropy(labels))
    better = evaluate(np.where(labels == 1, 2.0, -3.0), labels, 7)
    assert better.values["ne"] < 0.2 and better.values["auc"] == 1.0
    assert result.to_dict() == {"iteration": 7, "samples": 1000, **result.values}
    assert [m.name for m in METRICS] == ["auc", "logloss", "ne"]
    assert evaluate(np.zeros(3), np.ones(3), 1).values["ne"] is None  # one class: undefined
