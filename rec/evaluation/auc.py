"""ROC AUC, exact: the probability that a random positive scores above a random negative, ties
counting one half (the Mann-Whitney U statistic over the positives' average ranks), in O(n log n)."""

from __future__ import annotations

import numpy as np


def auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """AUC of ``scores`` against 0/1 ``labels``; None without both a positive and a negative."""
    positive = np.asarray(labels) > 0.5
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="stable")
    sorted_scores = np.asarray(scores)[order]
    # average rank (1-based) of each run of equal scores
    starts = np.flatnonzero(np.concatenate([[True], sorted_scores[1:] != sorted_scores[:-1]]))
    ends = np.concatenate([starts[1:], [len(sorted_scores)]])
    average = (starts + ends + 1) / 2.0
    ranks = np.repeat(average, ends - starts)
    positive_rank_sum = float(ranks[positive[order]].sum())
    return (positive_rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


class AUC:
    name = "auc"

    def __call__(self, logits: np.ndarray, labels: np.ndarray) -> float | None:
        return auc(logits, labels)  # the sigmoid keeps the order: AUC of logits is that of probabilities
