"""Keys grouped by value, and rows gathered and scattered whole: what a sparse table and a
client that sends it rows share, so that duplicates summed on either side give the same bits.

Pure: numpy only.
"""

from __future__ import annotations

import numpy as np


class KeyGroup:
    """Keys grouped by value: `order` sorts them, `starts` are where each distinct key's run
    begins in that order, `uniq` the distinct keys, ascending."""

    def __init__(self, keys: np.ndarray):
        n = self.n = len(keys)
        self.order = keys.argsort()
        sk = keys[self.order]
        # first[i]: sorted key i starts a run; first[n] closes the last one.
        first = self.first = np.empty(n + 1, bool)
        first[0] = first[n] = True
        np.not_equal(sk[1:], sk[:-1], out=first[1:n])
        self.starts = first[:n].nonzero()[0]
        self.uniq = sk[self.starts]

    def inverse(self) -> np.ndarray:
        """For each key, the index of its value in `uniq`."""
        inv = np.empty(self.n, np.int64)
        at = self.first[:self.n].cumsum(dtype=np.int64)
        at -= 1
        inv[self.order] = at
        return inv

    def nbytes(self) -> int:
        return self.order.nbytes + self.first.nbytes + self.starts.nbytes + self.uniq.nbytes


def rows_of(a: np.ndarray) -> np.ndarray:
    """A C-contiguous 2-D array seen as a 1-D array of one byte string per row: numpy gathers
    and scatters whole rows of that several times faster than rows of numbers."""
    return a.view(f"V{a.shape[1] * a.itemsize}").reshape(len(a))


def take_rows(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return rows_of(a)[idx].view(a.dtype).reshape(len(idx), a.shape[1])


def put_rows(a: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
    rows_of(a)[idx] = rows_of(np.ascontiguousarray(values, a.dtype))


def sum_duplicates(group: KeyGroup, grads: np.ndarray) -> np.ndarray:
    """The sum of each distinct key's grads, in the order of `group.uniq`. Sums of several
    grads are taken in float64 and rounded once to float32, so they do not depend on the
    order the duplicates came in (exactly so while the grads of a key span under 2^29 in
    magnitude)."""
    order, starts, first = group.order, group.starts, group.first
    if len(starts) == len(order):
        return take_rows(grads, order)
    out = take_rows(grads, order[starts])
    # Only keys with several grads need a sum; most keys in a batch have one. A run has
    # one grad when the next one starts right after it.
    multi = (~first[starts + 1]).nonzero()[0]
    several = first[:-1] & first[1:]
    np.logical_not(several, out=several)            # sorted grads in runs of several
    part = take_rows(grads, order[several]).astype(np.float64)
    at = first[:-1][several].nonzero()[0]           # where each run begins in part
    out[multi] = np.add.reduceat(part, at, axis=0)
    return out
