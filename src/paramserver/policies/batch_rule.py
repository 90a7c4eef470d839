"""The global-batch rule of an elastic job: what happens to the batch when workers come and go.

With a fixed worker count the job's `batch_size` is every worker's batch and nothing changes.
When membership changes, one of these rules says what the per-worker batch, the global batch
(all active workers' samples per step/round) and the learning-rate multiplier become:

- `fixed`: each worker keeps `batch_size`; the global batch follows the head count, the
  learning rate does not. (Today's behaviour; the rule of every non-elastic job.)
- `keep-global`: the global batch stays `batch_size x reference` (the reference head count is
  the job's minimum workers): per-worker batches are that total split as evenly as integers
  allow (the lowest ranks take the remainder), so an update averages the same number of
  samples whoever is there.
- `target:T`: hivemind's target batch size: each worker's batch is ceil(T / N), so a round of
  N workers collects at least T samples (at most N - 1 more).
- `linear`: each worker keeps `batch_size`, and the update is scaled by N / reference, the
  linear scaling rule (Goyal et al.): learning rate proportional to the global batch.

Pure: the policy host asks `terms(n)` on every join and leave, and records the answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RULES = ("fixed", "keep-global", "target", "linear")
HELP = ("global batch as workers come and go: fixed (each worker keeps --batch-size), "
        "keep-global (batch-size x MIN workers split over those present), target:T (each "
        "worker ceil(T/N): at least T per round), linear (each keeps --batch-size, the update "
        "scaled by N / MIN: lr follows the global batch)")


@dataclass(frozen=True)
class BatchTerms:
    """What holds while `workers` are active: the batch each worker gets by its place in rank
    order (`batches`), their sum, and the update's multiplier."""

    workers: int
    batches: tuple[int, ...]
    global_batch: int
    lr_scale: float

    def batch_of(self, index: int) -> int:
        """The batch of the `index`-th active worker in rank order."""
        return self.batches[index]

    def to_dict(self) -> dict:
        return {"workers": self.workers, "batches": list(self.batches),
                "global_batch": self.global_batch, "lr_scale": round(self.lr_scale, 6)}


@dataclass(frozen=True)
class BatchRule:
    """One rule (`name`), the job's per-worker `batch_size`, the `reference` head count (the
    job's minimum workers) and, for `target`, the target batch."""

    name: str = "fixed"
    batch_size: int = 32
    reference: int = 1
    target: int = 0

    def __post_init__(self):
        if self.name not in RULES:
            raise ValueError(f"batch rule {self.name!r}: expected one of {', '.join(RULES)}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise ValueError(f"batch rule: batch_size must be an integer >= 1, "
                             f"got {self.batch_size!r}")
        if not (isinstance(self.reference, int) and self.reference >= 1):
            raise ValueError(f"batch rule: reference must be an integer >= 1, "
                             f"got {self.reference!r}")
        if self.name == "target" and not (isinstance(self.target, int) and self.target >= 1):
            raise ValueError("batch rule target:T needs T, an integer >= 1 (e.g. target:256)")

    @classmethod
    def parse(cls, text: str, batch_size: int, reference: int) -> "BatchRule":
        """`fixed`, `keep-global`, `linear` or `target:T`."""
        name, _, arg = str(text).partition(":")
        if name != "target" and arg:
            raise ValueError(f"batch rule {text!r}: only target takes a value (target:T)")
        if name == "target":
            if not arg.isdigit():
                raise ValueError(f"batch rule {text!r}: target:T needs an integer T >= 1")
            return cls(name, batch_size, reference, int(arg))
        return cls(name, batch_size, reference)

    @property
    def changes_nothing(self) -> bool:
        return self.name == "fixed"

    def text(self) -> str:
        return f"target:{self.target}" if self.name == "target" else self.name

    def terms(self, workers: int) -> BatchTerms:
        """The batches and multiplier while `workers` (>= 0) are active."""
        n, b = max(int(workers), 0), self.batch_size
        if n == 0:
            return BatchTerms(0, (), 0, 1.0)
        if self.name == "keep-global":
            total = b * self.reference
            if total < n:  # one sample each at least: the total grows rather than a batch of 0
                batches = (1,) * n
            else:
                base, extra = divmod(total, n)
                batches = tuple(base + (i < extra) for i in range(n))
            return BatchTerms(n, batches, sum(batches), 1.0)
        if self.name == "target":
            each = math.ceil(self.target / n)
            return BatchTerms(n, (each,) * n, each * n, 1.0)
        scale = n / self.reference if self.name == "linear" else 1.0
        return BatchTerms(n, (b,) * n, b * n, scale)
