"""Push-time predictors: each worker's recorded push times -> its next R predicted push times."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from paramserver.core.registry import Registry


class PredictInputError(ValueError):
    """Raised for histories a predictor cannot use (too short, unsorted, non-finite, bad R)."""


def _flat_history(history) -> tuple[np.ndarray, np.ndarray]:
    """Validate per-worker histories; return flat times and row offsets (like PushTimes)."""
    if isinstance(history, np.ndarray):
        if history.ndim != 2:
            raise PredictInputError(f"history must be 2-D (workers x pushes), got shape {history.shape}")
        rows = list(history)
    elif isinstance(history, Sequence) and not isinstance(history, (str, bytes)):
        rows = [np.asarray(r) for r in history]
    else:
        raise PredictInputError("history must be a 2-D array or a sequence of per-worker sequences")
    if not rows:
        raise PredictInputError("history holds no workers")
    for i, r in enumerate(rows):
        if r.ndim != 1 or r.dtype.kind not in "iuf":
            raise PredictInputError(f"worker {i}: history must be a 1-D sequence of numbers")
        if r.size < 2:
            raise PredictInputError(f"worker {i}: need at least two recorded pushes, got {r.size}")
    values = np.concatenate([r.astype(np.float64 if r.dtype.kind == "f" else np.int64) for r in rows])
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([r.size for r in rows], out=offsets[1:])
    _check(values, offsets)
    return values, offsets


def _check(values: np.ndarray, offsets: np.ndarray) -> None:
    if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
        bad = int(np.flatnonzero(~np.isfinite(values))[0])
        w = int(np.searchsorted(offsets, bad, side="right") - 1)
        raise PredictInputError(f"worker {w}: non-finite recorded push time")
    down = np.diff(values) < 0
    down[offsets[1:-1] - 1] = False
    if down.any():
        w = int(np.searchsorted(offsets, int(np.flatnonzero(down)[0]) + 1, side="right") - 1)
        raise PredictInputError(f"worker {w}: recorded push times are not sorted")


def _intervals(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat intervals (row i has lengths[i] - 1 of them) and their row offsets."""
    d = np.diff(values)
    keep = np.ones(d.size, dtype=bool)
    keep[offsets[1:-1] - 1] = False
    return d[keep], offsets - np.arange(offsets.size)


def _extrapolate(t_last: np.ndarray, interval: np.ndarray, lookahead: int) -> np.ndarray:
    if not isinstance(lookahead, (int, np.integer)) or isinstance(lookahead, bool) or lookahead < 1:
        raise PredictInputError(f"lookahead R must be a positive integer, got {lookahead!r}")
    r = np.arange(lookahead, dtype=interval.dtype)
    return t_last[:, None] + r[None, :] * interval[:, None]


def last_interval(history, lookahead: int) -> np.ndarray:
    """The published rule: t_last + r * (t_last - t_prev), r = 0..R-1. Ints stay exact."""
    values, offsets = _flat_history(history)
    t_last = values[offsets[1:] - 1]
    return _extrapolate(t_last, t_last - values[offsets[1:] - 2], lookahead)


def ema(history, lookahead: int, alpha: float = 0.5) -> np.ndarray:
    """t_last + r * EMA of the intervals (seeded by the first; weight alpha on the newest)."""
    if not 0.0 < alpha <= 1.0:
        raise PredictInputError(f"alpha must be in (0, 1], got {alpha}")
    values, offsets = _flat_history(history)
    d, d_off = _intervals(values, offsets)
    counts = np.diff(d_off)
    # Closed form of e_j = alpha*d_j + (1-alpha)*e_{j-1}: weight alpha*(1-alpha)^age, and the
    # seed interval keeps (1-alpha)^age; vectorized over ragged rows without a Python loop.
    age = np.repeat(d_off[1:] - 1, counts) - np.arange(d.size)
    w = alpha * (1.0 - alpha) ** age
    w[d_off[:-1]] = (1.0 - alpha) ** (counts - 1)
    est = np.add.reduceat(w * d, d_off[:-1])
    return _extrapolate(values[offsets[1:] - 1].astype(np.float64), est, lookahead)


def median(history, lookahead: int, k: int = 5) -> np.ndarray:
    """t_last + r * median of the last k intervals (fewer if fewer were recorded)."""
    if k < 1:
        raise PredictInputError(f"k must be >= 1, got {k}")
    values, offsets = _flat_history(history)
    d, d_off = _intervals(values, offsets)
    take = np.arange(-k, 0)[None, :] + d_off[1:, None]
    window = np.where(take >= d_off[:-1, None], d[np.maximum(take, 0)], np.nan)
    est = np.nanmedian(window.astype(np.float64), axis=1)
    return _extrapolate(values[offsets[1:] - 1].astype(np.float64), est, lookahead)


PREDICTORS: Registry[Callable[..., np.ndarray]] = Registry("push-time predictor")
PREDICTORS.register("last_interval")(last_interval)
PREDICTORS.register("ema")(ema)
PREDICTORS.register("median")(median)


def get_predictor(name: str) -> Callable[..., np.ndarray]:
    """Look a predictor up by name; an unknown name fails with the list of known ones."""
    return PREDICTORS.get(name)
