"""What an evaluation metric is: a name, and a value from every evaluated sample's logit and label."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class EvalMetric(Protocol):
    name: str  # train_metrics.json's key under ``eval``; MLflow logs it as ``eval_<name>``

    def __call__(self, logits: np.ndarray, labels: np.ndarray) -> float | None:
        """The metric over samples with these logits (float64) and 0/1 labels; None where it is
        undefined (e.g. AUC with one class only)."""
