"""An elastic job's worker sampler: batches drawn where the coordinator's ledger says.

Each release of an elastic job carries pieces (epoch, lo, hi) of that epoch's permutation of
the whole training set (coordinator/ledger.py); this sampler turns them into the batch. The
permutation of epoch e is the same on every worker: `epoch_order(size, seed, e)`.
"""

from __future__ import annotations

import numpy as np
import torch

from paramserver.core.pieces import Piece
from paramserver.data.core.sampler import BatchSampler, take_rows, take_sparse_rows

# Permutations kept: the newest epoch's and the one before (a leaver's pieces given back).
_KEEP = 3


def epoch_order(size: int, seed: int, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s permutation of range(size), from the job's seed."""
    return np.random.default_rng([int(seed), 0x5EED, int(epoch)]).permutation(size)


class LedgerSampler:
    """The BatchSampler interface (next_indices, next_batch, next_sparse_batch, epoch,
    samples_drawn) over the whole training split, drawing each batch from the pieces of the
    release it runs (`feed`)."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor, seed: int = 0,
                 ids: torch.Tensor | None = None):
        if len(X) != len(y) or len(X) == 0:
            raise ValueError(f"X has {len(X)} samples and y {len(y)}: need the same, >= 1")
        self.X, self.y, self.ids, self.seed = X, y, ids, seed
        self._orders: dict[int, np.ndarray] = {}
        self._pieces: tuple[Piece, ...] | None = ()
        self.samples_drawn = 0
        self.fallback_rank = 0  # the stream of a release without pieces (see feed)
        self._fallback: BatchSampler | None = None
        self._at = 0.0  # epochs, as far as the newest position drawn

    def __len__(self) -> int:
        return len(self.X)

    @property
    def epoch(self) -> float:
        """The newest epoch drawn from, fractional (its position / the set's size)."""
        return self._at

    def feed(self, pieces) -> None:
        """The pieces of the release about to run (wire form or Piece). None: the release
        named none (a coordinator restarted without a checkpoint to rebuild its ledger from):
        the batch is drawn from this worker's own stream (`fallback_rank`), not exactly-once."""
        if pieces is None:
            self._pieces = None
            return
        self._pieces = tuple(p if isinstance(p, Piece) else Piece.from_wire(p) for p in pieces)

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            order = self._orders[epoch] = epoch_order(len(self.X), self.seed, epoch)
            while len(self._orders) > _KEEP:
                del self._orders[min(self._orders)]
        return order

    def next_indices(self, batch_size: int) -> np.ndarray:
        pieces, self._pieces = self._pieces, ()
        if pieces is None:
            return self._own(batch_size)
        if sum(p.size for p in pieces) != batch_size:
            raise ValueError(f"the release's sample pieces hold {sum(p.size for p in pieces)} "
                             f"samples, its batch is {batch_size}")
        parts = []
        for p in pieces:
            if p.hi > len(self.X):
                raise ValueError(f"sample piece {p} beyond the training set of {len(self.X)}")
            parts.append(self._order(p.epoch)[p.lo:p.hi])
            self._at = max(self._at, p.epoch + p.hi / len(self.X))
        self.samples_drawn += batch_size
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _own(self, batch_size: int) -> np.ndarray:
        if self._fallback is None:
            self._fallback = BatchSampler(self.X, self.y, seed=self.seed + 7919 * (
                self.fallback_rank + 1))
        self.samples_drawn += batch_size
        return self._fallback.next_indices(batch_size)

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return take_rows(self.next_indices(batch_size), self.X, self.y)

    def next_sparse_batch(self, batch_size: int
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return take_sparse_rows(self.next_indices(batch_size), self.X, self.ids, self.y,
                                "this training set")
