"""`randomk`: k values at positions drawn from a shared seed; no indices on the wire.

The positions are stratified: the n positions are cut into k near-equal runs (run j is
[j*n//k, (j+1)*n//k)) and one position is drawn uniformly in each, from PCG64 seeded with
(seed, step, n). The payload is the header (seed, step) and k float32 values; a receiver
with the same `fraction` regenerates the positions, so sender and receiver agree from the
seed alone (PCG64's raw stream is fixed by numpy's stability policy). Positions come out
sorted and distinct, and each is picked with probability 1/len(its run) (= k/n when k
divides n).

decode puts each value at its position and zeros elsewhere: with `unbiased` the value is
multiplied by its run's length, so E[decode] == x exactly over the draws (for use without
error feedback); without, decode is a contraction (|d| <= |x| everywhere), the form error
feedback wants. Bound (not unbiased): d == x at the k positions, 0 elsewhere.
Bytes per value: 4k/n (+ two ints of header); the encoder's step counter is its state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paramserver.compression.codec import Codec, check_finite, min_max
from paramserver.core.options import check_int, check_range, opt


@dataclass(frozen=True)
class RandomKOptions:
    fraction: float = opt(0.01, "fraction of the values sent, in (0, 1]; at least one")
    seed: int = opt(0, "the shared seed; with the step it fixes each push's positions")
    unbiased: bool = opt(False, "scale each value by n/k (its run's length) so decode is "
                                "unbiased; leave off with error feedback")

    def __post_init__(self):
        check_range("fraction", self.fraction, 0.0, 1.0, lo_open=True)
        check_int("seed", self.seed, 0)
        if not isinstance(self.unbiased, bool):
            raise ValueError(f"unbiased must be True or False; got {self.unbiased!r}")


def runs(n: int, k: int) -> np.ndarray:
    """The k + 1 cut points of [0, n) into k near-equal runs."""
    return np.arange(k + 1, dtype=np.int64) * n // k if k else np.zeros(1, np.int64)


def random_positions(seed: int, step: int, n: int, k: int) -> np.ndarray:
    """k sorted distinct positions in [0, n): one uniform draw in each of the k runs."""
    cuts = runs(n, k)
    lengths = np.diff(cuts).astype(np.uint64)
    raw = np.random.PCG64(np.random.SeedSequence([seed, step, n])).random_raw(k)
    # A 64-bit draw modulo a run length under 2^31: the bias is below 2^-33.
    return cuts[:-1] + (raw % lengths).astype(np.int64)


class RandomK(Codec):
    name = "randomk"
    Options = RandomKOptions

    def reset(self) -> None:
        self.step = 0  # the next push's step: sender and receiver read it from the header

    def count(self, n: int) -> int:
        return min(n, max(1, round(self.opts.fraction * n))) if n else 0

    def layout(self, size, meta):
        if meta is not None and (len(meta) != 2 or not all(
                isinstance(m, int) and 0 <= m < 1 << 63 for m in meta)):
            raise ValueError(f"codec {self.name!r}: meta must be [seed, step]; got {meta!r}")
        return [("float32", self.count(size))]

    def _encode(self, v):
        n = v.numel()
        lo, hi = min_max(v)
        check_finite(self.name, lo, hi)
        seed, step = self.opts.seed, self.step
        self.step += 1
        values = v.numpy()[random_positions(seed, step, n, self.count(n))]
        return self._payload(n, (seed, step), values)

    def _decode(self, enc):
        seed, step = enc.meta
        n, values = enc.size, enc.frames[0]
        k = values.size
        pos = random_positions(seed, step, n, k)
        out = np.zeros(n, np.float32)
        if self.opts.unbiased:
            out[pos] = values * np.diff(runs(n, k)).astype(np.float32)
        else:
            out[pos] = values
        return out
