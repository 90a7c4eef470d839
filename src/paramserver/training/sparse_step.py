"""The embedding-row half of a training step, for a model whose rows live in a sparse table on
the servers (DLRM): the batch's ids hashed to keys, the rows of its unique keys pulled, handed
to the model as a leaf tensor, and their gradients pushed with the step's dense gradient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from paramserver.data.core.sampler import BatchSampler


class RowSource(Protocol):
    """Where rows come from: the servers (TableRows over a KVWorker) or a local table."""

    def start(self, keys: np.ndarray, min_version: int) -> Any: ...
    def wait(self, request: Any) -> np.ndarray: ...
    def abandon(self, request: Any) -> None: ...


class TableRows:
    """A RowSource reading one table of the job's servers through a KVWorker."""

    def __init__(self, kv, table: str):
        self.kv, self.table = kv, table

    def start(self, keys: np.ndarray, min_version: int):
        return self.kv.rows.pull_async(self.table, keys, min_version=min_version)

    def wait(self, request) -> np.ndarray:
        return self.kv.wait(request)

    def abandon(self, request) -> None:
        self.kv.completion.abandon(request)


@dataclass
class _Batch:
    X: torch.Tensor
    ids: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class _Pending:
    """A drawn batch whose rows are on their way."""

    batch: _Batch
    unique: np.ndarray
    inverse: np.ndarray  # (batch, fields) positions into unique
    min_version: int
    request: Any


class SparseRows:
    """Owns the batch of a step: `request` draws it and asks for the rows of its unique keys,
    `receive` waits for them, `forward` runs the model, `grads` gives the rows' gradients after
    backward. In round mode the train task requests the next step's rows right after its push
    (the shard answers once the round is applied), so the row pull leaves the critical path as
    the dense pull does; a release that asks for another version or batch size is met by asking
    again for the same drawn samples: none is skipped or repeated."""

    def __init__(self, model: torch.nn.Module, sampler: BatchSampler, source: RowSource,
                 device: torch.device | str = "cpu"):
        """`device`: the model's; the rows and the batch go there, the rows' gradients come
        back to the host for the push."""
        self.model, self.sampler, self.source = model, sampler, source
        self.device = torch.device(device)
        self.table: str = model.sparse_table
        self.held: list[_Batch] = []  # drawn samples not trained yet, oldest first
        self.pending: _Pending | None = None
        self.ready: tuple | None = None  # (X, y, inverse) of the received batch
        self.unique: np.ndarray | None = None
        self.rows: torch.Tensor | None = None

    def _draw(self, n: int) -> _Batch:
        """The next n samples: held ones first (in order), then new ones from the sampler."""
        parts, have = [], 0
        while self.held and have < n:
            b = self.held.pop(0)
            if have + len(b) > n:  # split: the rest stays held, first in line
                cut = n - have
                self.held.insert(0, _Batch(b.X[cut:], b.ids[cut:], b.y[cut:]))
                b = _Batch(b.X[:cut], b.ids[:cut], b.y[:cut])
            parts.append(b)
            have += len(b)
        if have < n:
            parts.append(_Batch(*self.sampler.next_sparse_batch(n - have)))
        if len(parts) == 1:
            return parts[0]
        return _Batch(*(torch.cat([getattr(p, f) for p in parts]) for f in ("X", "ids", "y")))

    def request(self, batch_size: int, min_version: int = 0) -> None:
        """Make sure the rows of a batch of `batch_size` are on their way at `min_version`."""
        p = self.pending
        if p is not None:
            if len(p.batch) == batch_size and p.min_version == min_version:
                return  # asked ahead, as it turned out
            self.source.abandon(p.request)
            self.pending = None
            if len(p.batch) == batch_size:  # the same samples at another version
                self._send(p.batch, min_version)
                return
            self.held.insert(0, p.batch)
        self._send(self._draw(batch_size), min_version)

    def _send(self, batch: _Batch, min_version: int) -> None:
        keys = self.model.keys_of(batch.ids)
        unique, inverse = np.unique(keys.ravel(), return_inverse=True)
        self.pending = _Pending(batch, unique, inverse.reshape(keys.shape), min_version,
                                self.source.start(unique, min_version))

    def receive(self) -> int:
        """Wait for the requested rows; returns the bytes pulled (keys and rows)."""
        p, self.pending = self.pending, None
        if p is None:
            raise RuntimeError("receive before request: no batch drawn")
        values = np.asarray(self.source.wait(p.request))
        self.unique = p.unique
        self.rows = torch.from_numpy(values).to(self.device).requires_grad_()
        self.ready = p.batch.X, p.batch.y, p.inverse
        return p.unique.nbytes + values.nbytes

    def fetch(self, batch_size: int, min_version: int = 0) -> int:
        """request and receive: the next batch with its rows, now."""
        self.request(batch_size, min_version)
        return self.receive()

    def forward(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(class scores, labels) of the received batch; backward fills the rows' gradient."""
        if self.ready is None:
            raise RuntimeError("forward before receive: no rows")
        (X, y, inverse), self.ready = self.ready, None
        X, y = X.to(self.device, dtype), y.to(self.device)
        return self.model(X, self.model.gather(self.rows, inverse)), y

    def grads(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{table: (unique keys, their rows' gradients)} of the last batch, for push_step."""
        grad = self.rows.grad
        if grad is None:  # the loss did not reach the rows (never expected)
            grad = torch.zeros_like(self.rows)
        return {self.table: (self.unique,
                             np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32))}

    def nbytes(self) -> int:
        """Bytes the last batch's rows push: keys plus gradients."""
        return self.unique.nbytes + self.rows.numel() * 4
