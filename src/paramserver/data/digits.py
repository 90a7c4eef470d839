"""scikit-learn's bundled 8x8 handwritten digits (no download): the default, quick dataset."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from paramserver.data.base import Dataset, make_dataset, standardize, stratified_split


def digits_file() -> Path:
    """The CSV that scikit-learn ships (64 pixel columns and the label per row).

    Read directly: importing sklearn.datasets pulls in scipy and costs every worker process
    about a second of CPU at startup, for a file numpy parses in milliseconds.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the digits dataset ships with scikit-learn, which is not "
                                "installed: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations)), "datasets", "data", "digits.csv.gz")
    if not path.is_file():
        raise FileNotFoundError(f"scikit-learn's digits file is missing: {path}")
    return path


def read_digits(path: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) with values 0..16, labels (1797,)) from the bundled CSV."""
    with gzip.open(path or digits_file(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float64)
    if table.ndim != 2 or table.shape[1] != 65:
        raise ValueError(f"digits file has shape {table.shape}, expected (N, 65)")
    return table[:, :64].reshape(-1, 8, 8), table[:, 64].astype(np.int64)


def load_digits(data_dir=None, seed: int = 0, test_fraction: float = 0.2,
                split_seed: int = 0) -> Dataset:
    """1797 images (N, 1, 8, 8), 10 classes; a stratified test split fixed by `split_seed`.

    `seed` is ignored on purpose: runs with different training seeds share one test set.
    """
    test_fraction = float(test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    images, labels = read_digits()
    X = (images / 16.0).astype(np.float32)[:, None, :, :]
    train, test = stratified_split(labels, test_fraction, seed=int(split_seed))
    X_tr, X_te = standardize(X[train], X[test])
    return make_dataset("digits", X_tr, labels[train], X_te, labels[test], num_classes=10)
