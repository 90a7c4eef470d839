"""The area under the ROC curve, exactly, from scores and binary labels (pure: numpy only)."""

from __future__ import annotations

import numpy as np


def roc_auc(scores, labels) -> float:
    """P(score of a random positive > score of a random negative), ties counted as one half.

    Rank-based (the Mann-Whitney U statistic): tied scores share their mean rank, which is the
    same as counting each tied positive/negative pair as half a win. O(n log n). NaN when the
    labels hold one class only (no pair to compare). `labels` are 0/1 (or booleans)."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel()
    if s.shape != y.shape:
        raise ValueError(f"{s.size} scores but {y.size} labels")
    if np.isnan(s).any():
        raise ValueError("scores hold NaN")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    pos = y.astype(bool)
    n_pos = int(pos.sum())
    n_neg = s.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    # 1-based rank of each distinct score's first copy, then the mean rank over its copies.
    first = np.cumsum(counts) - counts + 1
    mid_rank = first + (counts - 1) / 2.0
    rank_sum = float(mid_rank[inverse][pos].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)
