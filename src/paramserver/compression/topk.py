"""`topk`: a static fraction: send the round(fraction * n) largest |g|, exactly that many."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paramserver.compression.base import Compressor, FeedbackOptions, Selection
from paramserver.compression.select import SAMPLED_ABOVE, top_k_exact, top_k_sampled
from paramserver.core.options import check_choice, check_range, opt


@dataclass(frozen=True)
class TopKOptions(FeedbackOptions):
    fraction: float = opt(0.01, "fraction of the entries to send, in (0, 1] (e.g. 0.1, 0.01, "
                                "0.001); at least one entry is sent")
    method: str = opt("auto", "exact: full torch.topk; sampled: threshold from a 1% sample, "
                              f"then exact top-k of the survivors; auto: sampled above "
                              f"{SAMPLED_ABOVE} entries. All three send the same entries")
    seed: int = opt(0, "seed of the sampler (reset() restarts it)")

    def __post_init__(self):
        super().__post_init__()
        check_range("fraction", self.fraction, 0.0, 1.0, lo_open=True)
        check_choice("method", self.method, ("auto", "exact", "sampled"))


class TopK(Compressor):
    """Send the k = max(1, round(fraction * n)) largest magnitudes, exactly k of them (zeros
    too when fewer are nonzero: the push size is fixed). Ties go to the lower position."""

    name = "topk"
    Options = TopKOptions

    def reset(self) -> None:
        super().reset()
        self._gen = torch.Generator().manual_seed(self.opts.seed)

    def count(self, n: int) -> int:
        return min(n, max(1, round(self.opts.fraction * n))) if n else 0

    def _select(self, cand: torch.Tensor, mag: torch.Tensor) -> Selection:
        n, method = mag.numel(), self.opts.method
        k = self.count(n)
        if k == 0:
            return Selection(torch.empty(0, dtype=torch.int64, device=mag.device), 0.0)
        if method == "sampled" or (method == "auto" and n > SAMPLED_ABOVE):
            keys, t = top_k_sampled(mag, k, self._gen)
        else:
            keys, t = top_k_exact(mag, k)
        return Selection(keys, t)
