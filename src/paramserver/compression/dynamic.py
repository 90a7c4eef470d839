"""`dynamic`: a threshold carried across steps: next = mean of the |g| above the current one."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paramserver.compression.base import Compressor, FeedbackOptions, Selection
from paramserver.compression.select import above
from paramserver.compression.std import std_threshold
from paramserver.options import check_choice, check_range, opt


@dataclass(frozen=True)
class DynamicOptions(FeedbackOptions):
    start: str = opt("std", "threshold of the first step (and of a restart): std = k * std(g), "
                            "mean = mean |g|")
    k: float = opt(1.0, "k of the std start")

    def __post_init__(self):
        super().__post_init__()
        check_choice("start", self.start, ("std", "mean"))
        check_range("k", self.k, 0.0, None, lo_open=True)


class DynamicThreshold(Compressor):
    """Send |g| > t; then t <- mean of the |g| that were sent.

    - First step: t comes from the `start` rule on that step's vector.
    - The mean of the values above t exceeds t, so t only ratchets up while the gradients keep
      their scale (with error feedback the growing residual pushes back). When the carried t
      keeps nothing, the step restarts: t is re-derived from the `start` rule on the same
      vector and selection runs again, so a step sends nothing only when nothing exceeds the
      start threshold either (e.g. an all-zero vector); then t is carried unchanged.
    """

    name = "dynamic"
    Options = DynamicOptions

    def reset(self) -> None:
        super().reset()
        self.threshold: float | None = None  # the one the next step will use

    def _start(self, cand: torch.Tensor, mag: torch.Tensor) -> float:
        if self.opts.start == "std":
            return std_threshold(cand, self.opts.k)
        return mag.mean().item() if mag.numel() else 0.0

    def _select(self, cand: torch.Tensor, mag: torch.Tensor) -> Selection:
        carried = self.threshold
        t = self._start(cand, mag) if carried is None else carried
        keys = above(mag, t)
        restarted = False
        if keys.numel() == 0 and carried is not None:
            t, restarted = self._start(cand, mag), True
            keys = above(mag, t)
        if keys.numel():
            self.threshold = mag[keys].mean().item()
        return Selection(keys, t, restarted)

    @property
    def state(self) -> dict:
        return {**super().state, "threshold": self.threshold}
