"""Input validation for the ZipLine search: one sorted, finite, non-empty row of push times per worker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Differences of int64 times must not overflow; 2**62 leaves headroom for max - min.
_INT_LIMIT = 2**62


class ZiplineInputError(ValueError):
    """Raised for input the search cannot accept (empty, unsorted, non-finite, wrong shape or type)."""


@dataclass(frozen=True, eq=False)
class PushTimes:
    """Validated push times of n workers, stored flat: row i is values[offsets[i]:offsets[i+1]].

    dtype is int64 when every input value was an integer, otherwise float64.
    """

    values: np.ndarray
    offsets: np.ndarray

    @property
    def n(self) -> int:
        return self.offsets.size - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def scalar(self, x):
        """A numpy scalar of this dtype as a plain Python int or float."""
        return int(x) if self.values.dtype.kind == "i" else float(x)


def _numeric(arr: np.ndarray, where: str) -> np.ndarray:
    kind = arr.dtype.kind
    if kind in "iu":
        if kind == "u" and arr.size and int(arr.max()) >= _INT_LIMIT:
            raise ZiplineInputError(f"{where}: integer push times too large for int64 arithmetic")
        return arr.astype(np.int64, copy=False)
    if kind == "f":
        return arr.astype(np.float64, copy=False)
    raise ZiplineInputError(f"{where}: push times must be numbers, got dtype {arr.dtype}")


def _rows_to_flat(times) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(times, np.ndarray):
        if times.ndim != 2:
            raise ZiplineInputError(
                f"expected a 2-D array (workers x predicted pushes), got shape {times.shape}")
        n, r = times.shape
        flat = _numeric(np.ascontiguousarray(times), "input").ravel()
        return flat, np.arange(n + 1, dtype=np.int64) * r
    if isinstance(times, (str, bytes)) or not isinstance(times, Sequence):
        raise ZiplineInputError("expected a 2-D array or a sequence of per-worker sequences")
    rows = []
    for i, row in enumerate(times):
        arr = np.asarray(row)
        if arr.ndim != 1:
            raise ZiplineInputError(f"worker {i}: expected a 1-D sequence of push times")
        rows.append(_numeric(arr, f"worker {i}") if arr.size else arr.astype(np.float64))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([r.size for r in rows], out=offsets[1:])
    if not rows:
        return np.empty(0), offsets
    # Mixing ints and floats promotes everything to float64, as numpy would.
    return np.concatenate(rows), offsets


def validate(times) -> PushTimes:
    """Check and normalise `times` (n x R array or ragged sequence of rows) into PushTimes."""
    if isinstance(times, PushTimes):
        return times
    values, offsets = _rows_to_flat(times)
    n = offsets.size - 1
    if n == 0:
        raise ZiplineInputError("no workers: the input holds no rows")
    empty = np.flatnonzero(np.diff(offsets) == 0)
    if empty.size:
        raise ZiplineInputError(f"worker {empty[0]} has no push times")
    _check_values(values, offsets)
    return PushTimes(values=values, offsets=offsets)


def _where(offsets: np.ndarray, flat_index: int) -> str:
    w = int(np.searchsorted(offsets, flat_index, side="right") - 1)
    return f"worker {w}, index {flat_index - int(offsets[w])}"


def _check_values(values: np.ndarray, offsets: np.ndarray) -> None:
    if values.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ZiplineInputError(
                f"non-finite push time {values[bad[0]]} at {_where(offsets, int(bad[0]))}")
    else:
        lo, hi = int(values.min()), int(values.max())
        if hi - lo >= _INT_LIMIT or abs(lo) >= _INT_LIMIT or abs(hi) >= _INT_LIMIT:
            raise ZiplineInputError("integer push times too large: differences would overflow int64")
    down = np.diff(values) < 0
    # A step from one worker's last time to the next worker's first is not an ordering violation.
    down[offsets[1:-1] - 1] = False
    bad = np.flatnonzero(down)
    if bad.size:
        raise ZiplineInputError(
            f"push times not sorted: decrease at {_where(offsets, int(bad[0]) + 1)}")
