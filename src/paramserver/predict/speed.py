"""Speed predictors for LB-BSP: a worker's past speeds (and host load) -> its next speed.

Each predictor sees one worker: `observe(speed, cpu_load, free_mem)` once per step (speed in
samples/s; cpu_load in percent and free_mem as a fraction, both None when not measured),
`predict()` -> the expected speed of its next step, or None before the first observation.
Pure: nothing here measures anything; the worker sends the readings with its push.
"""

from __future__ import annotations

import math
import statistics
from abc import ABC, abstractmethod
from collections import deque


class SpeedPredictor(ABC):
    """One worker's speed forecaster."""

    name = "?"

    @abstractmethod
    def observe(self, speed: float, cpu_load: float | None = None,
                free_mem: float | None = None) -> None: ...

    @abstractmethod
    def predict(self) -> float | None: ...


def _check_speed(speed: float) -> float:
    if not (speed > 0 and math.isfinite(speed)):
        raise ValueError(f"a speed must be finite and > 0, got {speed}")
    return float(speed)


class LastSpeed(SpeedPredictor):
    """The next step runs as fast as the last one."""

    name = "last"

    def __init__(self):
        self.last: float | None = None

    def observe(self, speed, cpu_load=None, free_mem=None):
        self.last = _check_speed(speed)

    def predict(self):
        return self.last


class EMASpeed(SpeedPredictor):
    """Exponential moving average; `alpha` weighs the newest speed."""

    name = "ema"

    def __init__(self, alpha: float = 0.5):
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha, self.value = alpha, None

    def observe(self, speed, cpu_load=None, free_mem=None):
        s = _check_speed(speed)
        self.value = s if self.value is None else self.alpha * s + (1 - self.alpha) * self.value

    def predict(self):
        return self.value


class MedianSpeed(SpeedPredictor):
    """Median of the last `window` speeds: robust to one-off hiccups."""

    name = "median"

    def __init__(self, window: int = 5):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.recent: deque[float] = deque(maxlen=window)

    def observe(self, speed, cpu_load=None, free_mem=None):
        self.recent.append(_check_speed(speed))

    def predict(self):
        return statistics.median(self.recent) if self.recent else None
