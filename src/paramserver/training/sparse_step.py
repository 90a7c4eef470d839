"""The embedding-row half of a training step, for a model whose rows live in a sparse table on
the servers (DLRM): the batch's ids hashed to keys, the rows of its unique keys pulled, handed
to the model as a leaf tensor, and their gradients pushed with the step's dense gradient."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from paramserver.data.sampler import BatchSampler

RowReader = Callable[[np.ndarray, int], np.ndarray]  # (unique keys, min_version) -> rows


class SparseRows:
    """Owns one batch at a time: `fetch` draws it and pulls its rows, `forward` runs the model
    on it, `grads` gives the rows' gradients after backward. Works on any `pull_rows`-like
    reader, so a local table (tests, a reference run) drives it as the servers do."""

    def __init__(self, model: torch.nn.Module, sampler: BatchSampler, read_rows: RowReader):
        self.model, self.sampler, self.read_rows = model, sampler, read_rows
        self.table: str = model.sparse_table
        self.batch: tuple | None = None  # (X, y, inverse) of the fetched batch
        self.unique: np.ndarray | None = None
        self.rows: torch.Tensor | None = None

    def fetch(self, batch_size: int, min_version: int = 0) -> int:
        """Draw the next batch and pull the rows of its unique keys; returns the bytes pulled."""
        X, ids, y = self.sampler.next_sparse_batch(batch_size)
        keys = self.model.keys_of(ids)
        self.unique, inverse = np.unique(keys.ravel(), return_inverse=True)
        values = self.read_rows(self.unique, min_version)
        self.rows = torch.from_numpy(np.asarray(values)).requires_grad_()
        self.batch = X, y, inverse.reshape(keys.shape)
        return self.unique.nbytes + values.nbytes

    def forward(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(class scores, labels) of the fetched batch; backward fills the rows' gradient."""
        if self.batch is None:
            raise RuntimeError("forward before fetch: no batch drawn")
        X, y, inverse = self.batch
        self.batch = None
        return self.model(X.to(dtype), self.model.gather(self.rows, inverse)), y

    def grads(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{table: (unique keys, their rows' gradients)} of the last batch, for push_step."""
        grad = self.rows.grad
        if grad is None:  # the loss did not reach the rows (never expected)
            grad = torch.zeros_like(self.rows)
        return {self.table: (self.unique, np.ascontiguousarray(grad.numpy(), dtype=np.float32))}

    def nbytes(self) -> int:
        """Bytes the last batch's rows push: keys plus gradients."""
        return self.unique.nbytes + self.rows.numel() * 4
