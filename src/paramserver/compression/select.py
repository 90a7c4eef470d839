"""Selection kernels on magnitudes: exact top-k (full or sampled pre-filter) and thresholds.

Every kernel returns sorted int64 positions. Ties are broken towards the lower position, so
the result is one well-defined set (the one `np.argsort(-mag, kind="stable")[:k]` gives).
"""

from __future__ import annotations

import math

import numpy as np
import torch

# Above this many elements the sampled pre-filter beats a full torch.topk at every fraction
# (benchmarks/compression.py, 1 thread: at 30K it loses at 0.1%; at 60K 0.21 vs 0.30 ms at
# 0.1% and 0.55 vs 1.06 ms at 10%).
SAMPLED_ABOVE = 50_000
SAMPLE_FRACTION = 0.01
MIN_SAMPLE = 1024
# Sample rank margin in binomial standard deviations; a miss only costs a full topk.
MARGIN_SIGMAS = 3.0


def nonzero_1d(mask: torch.Tensor) -> torch.Tensor:
    """Sorted positions of the set entries, on mask's device."""
    if mask.device.type != "cpu":
        return torch.nonzero(mask).view(-1)
    # np.flatnonzero on the shared buffer: torch.nonzero measured 5-80x slower on one thread
    # (22 vs 0.3 ms for 0.6M entries, 65% set).
    return torch.from_numpy(np.flatnonzero(mask.numpy()))


def above(mag: torch.Tensor, threshold: float) -> torch.Tensor:
    """Positions with mag > threshold (strictly: a zero threshold never sends zeros)."""
    return nonzero_1d(mag > threshold)


def kth_largest(mag: torch.Tensor, k: int) -> float:
    """The k-th largest value (1-based); topk from whichever end is shorter."""
    n = mag.numel()
    if k <= n - k + 1:
        return torch.topk(mag, k, sorted=False).values.min().item()
    return torch.topk(mag, n - k + 1, largest=False, sorted=False).values.max().item()


def first_k_at_least(mag: torch.Tensor, threshold: float, k: int) -> torch.Tensor:
    """Positions with mag >= threshold, dropping the highest-positioned ties beyond k."""
    idx = nonzero_1d(mag >= threshold)
    excess = idx.numel() - k
    if excess > 0:
        tied = nonzero_1d(mag[idx] == threshold)
        keep = torch.ones(idx.numel(), dtype=torch.bool, device=idx.device)
        keep[tied[-excess:]] = False
        idx = idx[keep]
    return idx


def top_k_exact(mag: torch.Tensor, k: int) -> tuple[torch.Tensor, float]:
    """The k largest magnitudes' positions and the k-th magnitude, by a full torch.topk."""
    n = mag.numel()
    if k >= n:
        return torch.arange(n, device=mag.device), (mag.min().item() if n else 0.0)
    t = kth_largest(mag, k)
    return first_k_at_least(mag, t, k), t


def sample_threshold(mag: torch.Tensor, k: int, gen: torch.Generator) -> float:
    """A value that at least k magnitudes reach with high probability (from a ~1% sample)."""
    n = mag.numel()
    m = min(n, max(MIN_SAMPLE, int(n * SAMPLE_FRACTION)))
    # Drawn on the host generator wherever mag lives: the same sample on every device.
    sample = mag[torch.randint(n, (m,), generator=gen).to(mag.device)]
    q = k / n
    rank = math.ceil(m * q + MARGIN_SIGMAS * math.sqrt(m * q * (1 - q))) + 1
    return kth_largest(sample, min(m, rank))


def top_k_sampled(mag: torch.Tensor, k: int, gen: torch.Generator) -> tuple[torch.Tensor, float]:
    """Same result as top_k_exact: filter by a sampled threshold, then exact top-k of the rest.

    Falls back to the full topk when the sample overestimated the threshold (fewer than k
    candidates), so the count is always exactly k.
    """
    n = mag.numel()
    if k >= n:
        return top_k_exact(mag, k)
    cand = nonzero_1d(mag >= sample_threshold(mag, k, gen))
    if cand.numel() < k:
        return top_k_exact(mag, k)
    # Every magnitude >= the true k-th is a candidate, so the exact top-k of the candidates
    # (ties to the lower position; cand is sorted) is the exact top-k of mag.
    pos, t = top_k_exact(mag[cand], k)
    return cand[pos], t
