"""PaceBook: each worker's recent steps, as the policy sees them (release out, push in).

A step's time from its release to its push is the worker's compute plus its pull and push;
the push's own compute_time splits the two. The auto policy forecasts every candidate from
these, so they must not depend on the policy in force: a step's time starts when its release
goes out, not when the worker asked, so a barrier's wait is never counted as the worker's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True)
class Pace:
    """One worker's recent pace: `per_sample` compute seconds per sample, `overhead` seconds
    per step besides compute (pull, push, the wire), `steps` the recent step times, newest last."""

    per_sample: float
    overhead: float
    steps: tuple[float, ...]

    @property
    def mean(self) -> float:
        """The mean of the recent step times."""
        return sum(self.steps) / len(self.steps)


class PaceBook:
    """The last `window` steps of each worker. Pure: every time comes in as an argument."""

    def __init__(self, window: int = 8, least: int = 1):
        """`least`: steps on record that make a worker's pace known (`known`)."""
        if not 1 <= least <= window:
            raise ValueError(f"need 1 <= least <= window, got {least} and {window}")
        self.window = window
        self.least = least
        self._out: dict[int, float] = {}  # when each worker's release went out
        self._steps: dict[int, deque] = {}  # (step seconds, compute seconds, batch)
        # The workers with `least` steps on record: asked at every push, so kept, not counted.
        self.known: set[int] = set()

    def released(self, worker: int, at: float) -> None:
        self._out[worker] = at

    def pushed(self, worker: int, now: float, batch: int, compute: float) -> None:
        start = self._out.pop(worker, None)
        if start is None or batch < 1:
            return  # a step whose release this book never saw (it joined mid-step)
        took = max(now - start, compute, 0.0)
        book = self._steps.get(worker)
        if book is None:
            book = self._steps[worker] = deque(maxlen=self.window)
        book.append((took, max(compute, 0.0), batch))
        if len(book) == self.least:
            self.known.add(worker)

    def forget(self, worker: int) -> None:
        self._out.pop(worker, None)
        self._steps.pop(worker, None)
        self.known.discard(worker)

    def pace(self, worker: int, batch: int) -> Pace | None:
        """The worker's pace, its step times as they would have been at `batch` samples (so
        that steps under a policy that sized batches, LB-BSP, still show the jitter of the
        others); None until it has a step on record."""
        book = self._steps.get(worker)
        if not book:
            return None
        per_sample = median(c / b for _, c, b in book)
        overhead = median(t - c for t, c, _ in book)
        steps = tuple(c * batch / b + (t - c) for t, c, b in book)
        return Pace(per_sample, overhead, steps)
