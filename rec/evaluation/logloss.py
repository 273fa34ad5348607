"""Logloss (mean binary cross-entropy of the predicted click probability) and normalized entropy.

NE, as in He et al. 2014 (Practical Lessons from Predicting Clicks on Ads at Facebook) and TorchRec's
``NEMetric``: the logloss divided by the entropy of the evaluation set's own click rate, i.e. the
logloss of always predicting that rate. Below 1 the model beats the base rate; it is undefined when
every label is the same.
"""

from __future__ import annotations

import numpy as np


def logloss(logits: np.ndarray, labels: np.ndarray) -> float | None:
    """Mean of ``-y log p - (1-y) log(1-p)`` with ``p = sigmoid(logit)``, computed from the logits
    (``log p = -softplus(-logit)``) so that confident predictions do not overflow."""
    if len(logits) == 0:
        return None
    z = np.asarray(logits, np.float64)
    y = np.asarray(labels, np.float64)
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def base_entropy(labels: np.ndarray) -> float | None:
    """The logloss of predicting the click rate of ``labels`` for every sample (None if 0 or 1)."""
    if len(labels) == 0:
        return None
    p = float(np.mean(np.asarray(labels, np.float64)))
    if p <= 0.0 or p >= 1.0:
        return None
    return float(-(p * np.log(p) + (1 - p) * np.log(1 - p)))


class Logloss:
    name = "logloss"

    def __call__(self, logits: np.ndarray, labels: np.ndarray) -> float | None:
        return logloss(logits, labels)


class NormalizedEntropy:
    name = "ne"

    def __call__(self, logits: np.ndarray, labels: np.ndarray) -> float | None:
        loss, base = logloss(logits, labels), base_entropy(labels)
        return None if loss is None or base is None else loss / base
