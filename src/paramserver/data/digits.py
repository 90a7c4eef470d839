"""scikit-learn's bundled 8x8 handwritten digits (no download): the default, quick dataset."""

from __future__ import annotations

import numpy as np

from paramserver.data.base import Dataset, make_dataset, standardize


def load_digits(data_dir=None, seed: int = 0, test_fraction: float = 0.2,
                split_seed: int = 0) -> Dataset:
    """1797 images (N, 1, 8, 8), 10 classes; a stratified test split fixed by `split_seed`.

    `seed` is ignored on purpose: runs with different training seeds share one test set.
    """
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    test_fraction = float(test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    bunch = sk_load_digits()
    X = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, bunch.target, test_size=test_fraction, stratify=bunch.target,
        random_state=int(split_seed))
    X_tr, X_te = standardize(X_tr, X_te)
    return make_dataset("digits", X_tr, y_tr, X_te, y_te, num_classes=10)
