"""Range push/pull: which keys a worker pushes and pulls at each step, and what it holds back.

`--push-range` grammar:
    all         every key every step (the default)
    window:F    the key space cut into ceil(1/F) equal windows; step s uses window s mod W
    layers[:K]  windows of K whole layers (default 1), in model order; step s uses s mod W

The gradient of keys outside the step's window is not lost: it accumulates locally
(RangeAccumulator) and goes out, summed, the next time its window comes round, as error
feedback does for pruning. Pulls fetch the same window; the other keys keep their last values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from paramserver.core.keyspace import KeyRange

HELP = ("keys pushed and pulled per step: all (default), window:F (a rotating window of a "
        "fraction F of the keys, e.g. window:0.25), layers[:K] (K whole layers at a time, "
        "rotating); held-back gradients accumulate and go out with their window")


@dataclass(frozen=True)
class RangePlan:
    """The windows a worker cycles through, one per step."""

    windows: tuple[KeyRange, ...]

    def at(self, step: int) -> KeyRange:
        return self.windows[step % len(self.windows)]


def _equal_windows(num_keys: int, fraction: float) -> tuple[KeyRange, ...]:
    count = min(num_keys, math.ceil(1.0 / fraction - 1e-9))
    cuts = [round(i * num_keys / count) for i in range(count + 1)]
    return tuple(KeyRange(a, b) for a, b in zip(cuts, cuts[1:]))


def _layer_windows(layers: list[KeyRange], per: int) -> tuple[KeyRange, ...]:
    groups = [layers[i:i + per] for i in range(0, len(layers), per)]
    return tuple(KeyRange(g[0].lo, g[-1].hi) for g in groups)


def make_plan(spec: str | None, num_keys: int, layers: list[KeyRange]) -> RangePlan | None:
    """The plan `spec` names for this key space; None for `all`. Bad specs: ValueError."""
    text = (spec or "all").strip().lower()
    kind, _, arg = text.partition(":")
    if kind == "all" and not arg:
        return None
    if kind == "window":
        try:
            fraction = float(arg)
        except ValueError:
            fraction = -1.0
        if not 0 < fraction <= 1:
            raise ValueError(f"--push-range {spec!r}: window:F needs 0 < F <= 1")
        return RangePlan(_equal_windows(num_keys, fraction))
    if kind == "layers":
        if arg and not arg.isdigit() or arg == "0":
            raise ValueError(f"--push-range {spec!r}: layers:K needs a whole K >= 1")
        if not layers:
            raise ValueError("--push-range layers: the model has no layers")
        return RangePlan(_layer_windows(list(layers), int(arg or 1)))
    raise ValueError(f"unknown --push-range {spec!r}; known: all, window:F, layers[:K]")


class RangeAccumulator:
    """Sums gradients; `take(window)` hands out (and clears) what the window holds."""

    def __init__(self, num_keys: int, dtype=np.float32):
        self.pending = np.zeros(num_keys, dtype=dtype)

    def add(self, grad: np.ndarray) -> None:
        self.pending += grad

    def take(self, window: KeyRange) -> np.ndarray:
        out = self.pending[window.lo:window.hi].copy()
        self.pending[window.lo:window.hi] = 0
        return out
