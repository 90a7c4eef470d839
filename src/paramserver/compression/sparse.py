"""The unit a compressed push carries: sorted int64 keys, their values, and the dense length."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paramserver.compression.codec import Encoded


@dataclass(frozen=True)
class Sparse:
    """keys: sorted, unique np.int64 positions in [0, dense_size); values: one per key.

    encoded: the values' payload when the compressor carries a codec; `values` is then what
    the payload decodes to (what a server adds), not what the gradient was."""

    keys: np.ndarray
    values: np.ndarray
    dense_size: int
    encoded: Encoded | None = None

    @property
    def nnz(self) -> int:
        return int(self.keys.size)

    @property
    def density(self) -> float:
        return self.nnz / self.dense_size if self.dense_size else 0.0

    @property
    def is_dense(self) -> bool:
        """Every key present: send `values` as a dense push and skip the keys."""
        return self.nnz == self.dense_size

    @property
    def nbytes(self) -> int:
        """Bytes of keys + values as the wire carries them today (int64 keys)."""
        return int(self.keys.nbytes + self.values.nbytes)

    @property
    def value_nbytes(self) -> int:
        """Bytes of the values as their codec would send them (as they are without one)."""
        return self.encoded.nbytes if self.encoded is not None else int(self.values.nbytes)

    @property
    def dense_nbytes(self) -> int:
        return int(self.dense_size * self.values.itemsize)


def densify(sparse: Sparse, out: np.ndarray | None = None) -> np.ndarray:
    """The dense vector a server would add: zeros except `values` at `keys`."""
    if out is None:
        out = np.zeros(sparse.dense_size, dtype=sparse.values.dtype)
    else:
        if out.shape != (sparse.dense_size,):
            raise ValueError(f"out must have shape ({sparse.dense_size},), got {out.shape}")
        out[:] = 0
    # Keys are unique by contract, so plain assignment equals the server's add-at.
    out[sparse.keys] = sparse.values
    return out
