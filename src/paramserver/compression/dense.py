"""`none`: the identity. Every key is sent, so the residual and velocity stay zero."""

from __future__ import annotations

import numpy as np
import torch

from paramserver.compression.base import Compressor, Selection, as_flat, host_values
from paramserver.compression.sparse import Sparse


class Dense(Compressor):
    """Sends the gradient as is. `values` shares memory with the gradient (no copy, like the
    dense push today) and `keys` is a cached read-only arange; `Sparse.is_dense` is True.

    error_feedback and momentum are accepted so every scheme takes them, but they change
    nothing: DGC's factor masking clears the whole velocity when everything is sent. With a
    codec, every value goes through it and error feedback keeps what the codec lost (the
    codec's error, or for randomk and powersgd what they leave out) in the residual.
    """

    name = "none"

    def reset(self) -> None:
        super().reset()
        self._keys = np.empty(0, dtype=np.int64)
        self._all = torch.empty(0, dtype=torch.int64)  # every position, for a codec's path

    def compress(self, grad) -> Sparse:
        if self.codec is not None:
            return super().compress(grad)
        g = self._check_size(as_flat(grad))
        n = g.numel()
        if self._keys.size != n:
            self._keys = np.arange(n, dtype=np.int64)
            self._keys.flags.writeable = False
        self._record(n, n, 0.0)
        return Sparse(self._keys, host_values(g), n)

    def _check_size(self, g: torch.Tensor) -> torch.Tensor:
        if self._size is not None and (g.numel(), g.dtype) != (self._size, self._dtype):
            raise ValueError(f"grad changed from {self._size} x {self._dtype} to {g.numel()} x "
                             f"{g.dtype}; call reset() first")
        self._size, self._dtype = g.numel(), g.dtype
        return g

    def _select(self, cand: torch.Tensor, mag: torch.Tensor) -> Selection:
        if self._all.numel() != cand.numel() or self._all.device != cand.device:
            self._all = torch.arange(cand.numel(), device=cand.device)
        return Selection(self._all, 0.0)
