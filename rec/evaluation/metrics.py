"""The metrics every evaluation reports, in this order (train_metrics.json's ``eval``, MLflow's
``eval_<name>``, ``shardflow compare``). A metric is one module with a class like ``auc.AUC``, plus
its line here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rec.evaluation.auc import AUC
from rec.evaluation.logloss import Logloss, NormalizedEntropy
from rec.evaluation.metric import EvalMetric

METRICS: tuple[EvalMetric, ...] = (AUC(), Logloss(), NormalizedEntropy())


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: after ``iteration`` iterations, over ``samples`` samples."""

    iteration: int
    samples: int
    values: dict[str, float | None]  # metric name -> value (None: undefined on these samples)

    def to_dict(self) -> dict[str, float | int | None]:
        return {"iteration": self.iteration, "samples": self.samples, **self.values}

    @classmethod
    def from_dict(cls, d: Mapping[str, float | int | None]) -> Evaluation:
        """``to_dict``'s mapping (as train_metrics.json holds it, checked) as an Evaluation again."""
        return cls(int(d["iteration"] or 0), int(d["samples"] or 0),
                   {k: None if v is None else float(v) for k, v in d.items() if k not in ("iteration", "samples")})


def evaluate(logits: np.ndarray, labels: np.ndarray, iteration: int) -> Evaluation:
    """Every metric of ``METRICS`` over these samples."""
    return Evaluation(iteration, len(labels), {m.name: m(logits, labels) for m in METRICS})
