"""A generated classification set for throughput work, tunable from easy to hard."""

from __future__ import annotations

import math

import numpy as np

from paramserver.data.base import Dataset, make_dataset

# difficulty -> (fraction of informative features, class separation, label-noise fraction,
# clusters per class). "hard" leaves few informative features and flips labels, so that the
# accuracy differences between sync policies show instead of every run reaching 100%.
DIFFICULTY = {
    "easy": (0.5, 2.0, 0.0, 1),
    "medium": (0.25, 1.0, 0.05, 2),
    "hard": (0.0, 0.6, 0.15, 2),
}


def _informative(fraction: float, features: int, classes: int, clusters: int) -> int:
    """Informative features for a preset; at least enough for make_classification's corners."""
    minimum = math.ceil(math.log2(classes * clusters))
    return min(features, max(minimum, round(fraction * features)))


def load_synthetic(data_dir=None, seed: int = 0, samples: int = 20000, features: int = 64,
                   classes: int = 10, difficulty: str = "medium", informative: int | None = None,
                   noise: float | None = None, class_sep: float | None = None,
                   clusters: int | None = None, test_fraction: float = 0.2) -> Dataset:
    """Vectors (N, features) from sklearn's make_classification, generated from `seed`.

    `difficulty` (easy, medium, hard) picks defaults; `informative`, `noise` (fraction of labels
    flipped at random), `class_sep` and `clusters` (per class) override them one by one.
    """
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split

    if difficulty not in DIFFICULTY:
        raise ValueError(f"unknown difficulty {difficulty!r}; known: {', '.join(DIFFICULTY)}")
    frac, sep, flip, per_class = DIFFICULTY[difficulty]
    samples, features, classes = int(samples), int(features), int(classes)
    per_class = int(clusters) if clusters is not None else per_class
    n_inf = int(informative) if informative is not None else _informative(
        frac, features, classes, per_class)
    if classes < 2 or samples < 2 * classes or not 1 <= n_inf <= features:
        raise ValueError(f"need classes >= 2, samples >= 2*classes and 1 <= informative <= "
                         f"features; got {samples=}, {features=}, {classes=}, informative={n_inf}")
    if classes * per_class > 2 ** n_inf:
        raise ValueError(f"{classes} classes x {per_class} clusters need at least "
                         f"{math.ceil(math.log2(classes * per_class))} informative features")
    X, y = make_classification(
        n_samples=samples, n_features=features, n_informative=n_inf, n_redundant=0,
        n_classes=classes, n_clusters_per_class=per_class,
        flip_y=float(noise) if noise is not None else flip,
        class_sep=float(class_sep) if class_sep is not None else sep, random_state=int(seed))
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=float(test_fraction), stratify=y, random_state=int(seed))
    X_tr, X_te = _standardize_columns(X_tr, X_te)
    return make_dataset("synthetic", X_tr, y_tr, X_te, y_te, num_classes=classes)


def _standardize_columns(train: np.ndarray, test: np.ndarray) -> list[np.ndarray]:
    """Per-feature standardization by training statistics (features are not pixels here)."""
    mean, std = train.mean(axis=0), train.std(axis=0)
    std[std == 0] = 1.0
    return [((a - mean) / std).astype(np.float32) for a in (train, test)]
