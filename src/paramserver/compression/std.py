"""`std`: a standard-deviation threshold: send |g| > k * std(g), std over this step's vector."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paramserver.compression.base import Compressor, FeedbackOptions, Selection
from paramserver.compression.select import above
from paramserver.options import check_range, opt


@dataclass(frozen=True)
class StdOptions(FeedbackOptions):
    k: float = opt(1.0, "send |g| > k * std(g) (e.g. 1, 2, 3)")

    def __post_init__(self):
        super().__post_init__()
        check_range("k", self.k, 0.0, None, lo_open=True)


def std_threshold(cand: torch.Tensor, k: float) -> float:
    """k * population std (ddof 0, like np.std) of the candidate vector, one Welford pass."""
    if cand.numel() == 0:
        return 0.0
    std, _ = torch.std_mean(cand, correction=0)
    return k * std.item()


class StdThreshold(Compressor):
    """The count varies: about 32% / 5% / 0.3% of a Gaussian vector for k = 1 / 2 / 3.
    An all-zero (or constant zero-std) vector sends nothing: the threshold is strict."""

    name = "std"
    Options = StdOptions

    def _select(self, cand: torch.Tensor, mag: torch.Tensor) -> Selection:
        t = std_threshold(cand, self.opts.k)
        return Selection(above(mag, t), t)
