"""Split a global batch into per-worker integer sizes proportional to speeds, within bounds."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def _clamped_sum(lam: float, weights: Sequence[float], lo: int, hi: int) -> float:
    return sum(min(max(lam * w, lo), hi) for w in weights)


def proportional_shares(total: int, weights: Sequence[float], lo: int, hi: int) -> list[float]:
    """Real shares clamp(lam * w_i, lo, hi) whose sum is `total` (needs n*lo < total < n*hi).

    The sum is continuous and nondecreasing in lam and linear between the breakpoints lo/w_i
    and hi/w_i; find the segment where it crosses `total` and solve the linear piece.
    """
    cuts = sorted({b / w for w in weights if w > 0 for b in (lo, hi)})
    # Binary search for the first breakpoint whose sum reaches the total: O(n log n).
    k = bisect.bisect_left(range(len(cuts)), True,
                           key=lambda i: _clamped_sum(cuts[i], weights, lo, hi) >= total)
    if k == len(cuts):
        raise ValueError("total unreachable within the bounds")  # callers check beforehand
    prev, cut = (cuts[k - 1] if k else 0.0), cuts[k]
    mid = (prev + cut) / 2
    free = [w for w in weights if lo < mid * w < hi]
    pinned = sum(min(max(mid * w, lo), hi) for w in weights if not lo < mid * w < hi)
    lam = (total - pinned) / sum(free) if free else cut
    return [min(max(lam * w, lo), hi) for w in weights]


def split_batch(total: int, weights: Sequence[float], lo: int = 1,
                hi: int | None = None) -> list[int]:
    """Integer sizes in [lo, hi], summing to `total`, proportional to `weights` (speeds).

    The real shares are clamp(lam * w_i, lo, hi) with lam chosen so that they sum to the
    total; rounding is by largest remainder (ties to the lower index), so a faster worker never
    gets less than a slower one. If the bounds make the total unreachable (n*lo > total or
    n*hi < total) every size sits at the violated bound and the sum misses the total by the
    least possible amount.
    """
    n = len(weights)
    if n == 0:
        return []
    hi = max(total, lo) if hi is None else hi
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 <= min_batch <= max_batch, got {lo}, {hi}")
    if any(not (w >= 0 and math.isfinite(w)) for w in weights):
        raise ValueError(f"speeds must be finite and >= 0, got {list(weights)}")
    if n * lo >= total:
        return [lo] * n
    if n * hi <= total:
        return [hi] * n
    top = max(weights)
    # Relative speeds (tiny or huge ones would under- or overflow); a zero speed still gets a
    # sliver of weight, so that the bounds can always be met.
    weights = [max(w / top, 1e-9) for w in weights] if top > 0 else [1.0] * n
    shares = proportional_shares(total, weights, lo, hi)
    sizes = [min(math.floor(s), hi) for s in shares]
    short = total - sum(sizes)
    for i in sorted(range(n), key=lambda i: (-(shares[i] - sizes[i]), i)):
        if short <= 0:
            break
        if sizes[i] < hi:  # float noise must not push a pinned share over its bound
            sizes[i] += 1
            short -= 1
    return sizes
