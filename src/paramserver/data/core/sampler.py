"""Batches of a caller-chosen, changing size drawn from one worker's shard, reshuffled per epoch."""

from __future__ import annotations

import numpy as np
import torch


class BatchSampler:
    """Draws batches without replacement within an epoch; a new permutation starts each epoch.

    The batch size is given per call because sync policies (LB-BSP, R2SP) change it every step.
    A batch that crosses an epoch boundary takes the epoch's remaining samples and fills up from
    the next permutation, so every batch has exactly the requested size and every sample is seen
    once per epoch. A batch larger than the shard spans several epochs (samples then repeat).
    Deterministic given (shard, seed). A shard with categorical ids (N, F) draws them along.
    """

    def __init__(self, X: torch.Tensor, y: torch.Tensor, seed: int = 0,
                 ids: torch.Tensor | None = None):
        if len(X) != len(y) or (ids is not None and len(ids) != len(y)):
            raise ValueError(f"X has {len(X)} samples but y has {len(y)}"
                             + ("" if ids is None else f" and ids {len(ids)}"))
        if len(X) == 0:
            raise ValueError("cannot sample batches from an empty shard")
        self.X, self.y, self.ids = X, y, ids
        self._rng = np.random.default_rng(seed)
        self._perm = self._rng.permutation(len(X))
        self._pos = 0
        self.epochs_done = 0
        self.samples_drawn = 0

    def __len__(self) -> int:
        return len(self.X)

    @property
    def epoch(self) -> float:
        """Epochs completed so far, fractional (samples drawn / shard size)."""
        return self.samples_drawn / len(self.X)

    def next_indices(self, batch_size: int) -> np.ndarray:
        """Indices into the shard of the next `batch_size` samples."""
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        parts, need = [], int(batch_size)
        while need:
            take = min(need, len(self._perm) - self._pos)
            parts.append(self._perm[self._pos:self._pos + take])
            self._pos += take
            need -= take
            if self._pos == len(self._perm):
                self._perm = self._rng.permutation(len(self.X))
                self._pos = 0
                self.epochs_done += 1
        self.samples_drawn += int(batch_size)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (X, y) batch of exactly `batch_size` samples (copies, safe to modify)."""
        return take_rows(self.next_indices(batch_size), self.X, self.y)

    def next_sparse_batch(self, batch_size: int
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next (X, ids, y) batch, for a shard with categorical ids."""
        return take_sparse_rows(self.next_indices(batch_size), self.X, self.ids, self.y,
                                "this shard")


def take_rows(index: np.ndarray, X: torch.Tensor, y: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (X, y) rows at `index` (copies): every sampler's batch."""
    at = torch.from_numpy(index)
    return X.index_select(0, at), y.index_select(0, at)


def take_sparse_rows(index: np.ndarray, X: torch.Tensor, ids: torch.Tensor | None,
                     y: torch.Tensor, what: str
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (X, ids, y) rows at `index` of a click log; `what` names the data in the error."""
    if ids is None:
        raise ValueError(f"{what} has no categorical ids (not a click log)")
    at = torch.from_numpy(index)
    return X.index_select(0, at), ids.index_select(0, at), y.index_select(0, at)
