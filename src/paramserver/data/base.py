"""The Dataset value every loader returns, and its split of the training set into worker shards."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paramserver.data.core.sampler import BatchSampler


@dataclass(frozen=True)
class Split:
    """Features X (float32; images (N, C, H, W), vectors (N, D)) and int64 labels y; a data
    set with categorical fields (clicks) adds their int64 ids (N, F), which no float holds
    exactly (ids range over 10^12)."""

    X: torch.Tensor
    y: torch.Tensor
    ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.X.dtype != torch.float32 or self.y.dtype != torch.int64:
            raise TypeError(f"expected float32 X and int64 y, got {self.X.dtype}, {self.y.dtype}")
        if self.y.ndim != 1 or len(self.X) != len(self.y):
            raise ValueError(f"X {tuple(self.X.shape)} and y {tuple(self.y.shape)} do not match")
        if self.ids is not None and (self.ids.dtype != torch.int64 or self.ids.ndim != 2
                                     or len(self.ids) != len(self.y)):
            raise ValueError(f"ids must be int64 (N, fields) with N = {len(self.y)}; got "
                             f"{self.ids.dtype} {tuple(self.ids.shape)}")

    @property
    def fields(self) -> int:
        """Categorical fields per sample (0: none)."""
        return 0 if self.ids is None else int(self.ids.shape[1])

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class Dataset:
    """A classification dataset: train and test splits plus what a model needs to know."""

    name: str
    train: Split
    test: Split
    num_classes: int

    def __post_init__(self) -> None:
        if self.train.X.shape[1:] != self.test.X.shape[1:]:
            raise ValueError("train and test samples have different shapes")
        if self.train.fields != self.test.fields:
            raise ValueError("train and test samples have different categorical fields")
        for split in (self.train, self.test):
            if len(split) and not (0 <= int(split.y.min()) and int(split.y.max()) < self.num_classes):
                raise ValueError(f"labels outside [0, {self.num_classes})")

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample: (C, H, W) for images, (D,) for feature vectors."""
        return tuple(self.train.X.shape[1:])

    @property
    def sparse_fields(self) -> int:
        """Categorical fields per sample, whose ids a model looks up in a sparse table."""
        return self.train.fields

    def shard_indices(self, rank: int, num_workers: int, seed: int = 0) -> np.ndarray:
        """Training-set indices of worker `rank`'s shard; all ranks must pass the same seed."""
        n = len(self.train)
        if num_workers < 1 or not 0 <= rank < num_workers:
            raise ValueError(f"rank {rank} is not in [0, {num_workers})")
        if num_workers > n:
            raise ValueError(f"{n} training samples cannot be shared by {num_workers} workers")
        # One shared permutation cut into near-equal contiguous pieces: disjoint and covering.
        perm = np.random.default_rng(seed).permutation(n)
        bounds = np.linspace(0, n, num_workers + 1).round().astype(np.int64)
        return np.sort(perm[bounds[rank]:bounds[rank + 1]])

    def shard(self, rank: int, num_workers: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(X, y) of worker `rank`'s disjoint shard of the training split."""
        index = torch.from_numpy(self.shard_indices(rank, num_workers, seed))
        return self.train.X.index_select(0, index), self.train.y.index_select(0, index)

    def sampler(self, rank: int, num_workers: int, seed: int = 0) -> BatchSampler:
        """A BatchSampler over worker `rank`'s shard; its shuffling stream differs per rank."""
        X, y = self.shard(rank, num_workers, seed)
        ids = None
        if self.train.ids is not None:
            index = torch.from_numpy(self.shard_indices(rank, num_workers, seed))
            ids = self.train.ids.index_select(0, index)
        stream = int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
        return BatchSampler(X, y, seed=stream, ids=ids)

    def describe(self) -> dict:
        """A JSON-ready summary for run logs."""
        out = {"dataset": self.name, "train": len(self.train), "test": len(self.test),
               "input_shape": list(self.input_shape), "num_classes": self.num_classes}
        if self.sparse_fields:
            out["sparse_fields"] = self.sparse_fields
        return out


def standardize(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Scale all arrays by the training set's global mean and std (one scalar each: image-safe)."""
    mean, std = float(train.mean()), float(train.std()) or 1.0
    return [((a - mean) / std).astype(np.float32) for a in (train, *others)]


def stratified_split(labels: np.ndarray, test_fraction: float,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, test indices), each sorted: ceil(fraction * N) test samples shared among
    the classes in proportion to their sizes (largest remainders get the odd ones), drawn at
    random within each class from `seed`."""
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    n_test = int(np.ceil(test_fraction * labels.size))
    exact = counts * (n_test / labels.size)
    take = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - take), kind="stable")
    take[order[:n_test - int(take.sum())]] += 1
    rng = np.random.default_rng(seed)
    test = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take)]
    test_idx = np.sort(np.concatenate(test))
    return np.setdiff1d(np.arange(labels.size), test_idx), test_idx


def make_dataset(name: str, X_train: np.ndarray, y_train: np.ndarray, X_test: np.ndarray,
                 y_test: np.ndarray, num_classes: int, ids_train: np.ndarray | None = None,
                 ids_test: np.ndarray | None = None) -> Dataset:
    """Wrap numpy arrays as a Dataset (float32 features, int64 labels and categorical ids)."""
    def split(X: np.ndarray, y: np.ndarray, ids: np.ndarray | None) -> Split:
        return Split(torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)),
                     torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64)),
                     None if ids is None else torch.from_numpy(
                         np.ascontiguousarray(ids, dtype=np.int64)))
    return Dataset(name, split(X_train, y_train, ids_train), split(X_test, y_test, ids_test),
                   int(num_classes))
