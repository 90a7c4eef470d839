"""MNIST from its four IDX files (raw or gzipped) in a local directory; nothing is downloaded."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from paramserver.data.base import Dataset, make_dataset, standardize
from paramserver.data.idx import IdxFormatError, read_idx

# Role -> base names; both the canonical "-idx3-" and the common ".idx3-" spellings are accepted.
MNIST_FILES = {
    "train_images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_images": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_labels": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}
DEFAULT_DIR_ENV = "PARAMSERVER_MNIST_DIR"


def default_mnist_dir() -> Path:
    """$PARAMSERVER_MNIST_DIR if set, else ./data/mnist."""
    return Path(os.environ.get(DEFAULT_DIR_ENV, "data/mnist"))


def find_mnist_files(data_dir: str | Path) -> dict[str, Path]:
    """Role -> path of each MNIST file in `data_dir`; one error lists every missing file."""
    data_dir = Path(data_dir)
    found, missing = {}, []
    for role, names in MNIST_FILES.items():
        candidates = [data_dir / (n + ext) for n in names for ext in ("", ".gz")]
        hit = next((p for p in candidates if p.is_file()), None)
        if hit is None:
            missing.append(f"{names[0]}[.gz]")
        else:
            found[role] = hit
    if missing:
        where = data_dir.resolve()
        where = f"{where}" if data_dir.is_dir() else f"{where} (no such directory)"
        raise FileNotFoundError(
            f"MNIST files missing from {where}: {', '.join(missing)} "
            f"(set --data-dir or ${DEFAULT_DIR_ENV}; raw or .gz IDX files, "
            f"'train-images.idx3-ubyte' spelling also accepted)")
    return found


def _read_pair(images_path: Path, labels_path: Path, limit: int | None):
    images = read_idx(images_path, ndim=3, dtype=np.uint8)
    labels = read_idx(labels_path, ndim=1, dtype=np.uint8)
    if len(images) != len(labels):
        raise IdxFormatError(f"{images_path.name} has {len(images)} images but "
                             f"{labels_path.name} has {len(labels)} labels")
    if labels.size and labels.max() > 9:
        raise IdxFormatError(f"{labels_path}: label {int(labels.max())} outside 0..9")
    if limit is not None:
        images, labels = images[:int(limit)], labels[:int(limit)]
    return images, labels


def load_mnist(data_dir: str | Path | None = None, seed: int = 0, train_limit: int | None = None,
               test_limit: int | None = None) -> Dataset:
    """Images (N, 1, 28, 28) scaled and standardized, labels 0..9; `*_limit` keep the first n.

    `seed` is unused: the split is the one the files define.
    """
    files = find_mnist_files(data_dir if data_dir is not None else default_mnist_dir())
    X_tr, y_tr = _read_pair(files["train_images"], files["train_labels"], train_limit)
    X_te, y_te = _read_pair(files["test_images"], files["test_labels"], test_limit)
    if X_tr.shape[1:] != X_te.shape[1:]:
        raise IdxFormatError(f"train images are {X_tr.shape[1:]} but test images {X_te.shape[1:]}")
    X_tr, X_te = standardize(X_tr[:, None].astype(np.float32) / 255.0,
                             X_te[:, None].astype(np.float32) / 255.0)
    return make_dataset("mnist", X_tr, y_tr, X_te, y_te, num_classes=10)
