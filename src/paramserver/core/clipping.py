"""Clipping a gradient by its norm, as torch's `clip_grad_norm_` does, in pieces.

A round's averaged gradient is summed on several shards, so its norm is put together from
each shard's partial (server/clip_round.py, coordinator/clip_rounds.py). The wire form of a
setting is [max_norm, norm_type] with the inf norm spelled "inf" (messages carry no
non-finite number); `setting` reads it, `wire` writes it.
"""

from __future__ import annotations

import math

from paramserver.core.words import shown

INF = math.inf
EPS = 1e-6  # torch's: max_norm / (total_norm + 1e-6)


def norm_type_of(value) -> float:
    """A norm type as torch takes it (a number > 0, inf or "inf"), as a float."""
    if isinstance(value, str) and value.strip().lower() == "inf":
        return INF
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"norm_type must be a number > 0 or inf, got {shown(value)}")
    p = float(value)
    if not (p == INF or (math.isfinite(p) and p > 0)):
        raise ValueError(f"norm_type must be a number > 0 or inf, got {shown(value)} (the "
                         f"servers put the norm together from each shard's part: -inf and 0 "
                         f"do not split so)")
    return p


def setting(value) -> tuple[float, float] | None:
    """[max_norm, norm_type] (wire form) as (max_norm, norm_type); None stays None."""
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        raise ValueError(f"clip must be [max_norm, norm_type], got {shown(value)}")
    max_norm = value[0]
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not (
            math.isfinite(max_norm) and max_norm >= 0):
        raise ValueError(f"clip's max_norm must be a finite number >= 0, got "
                         f"{shown(max_norm)}")
    return float(max_norm), norm_type_of(value[1])


def wire(max_norm: float, norm_type: float) -> list:
    return [float(max_norm), "inf" if norm_type == INF else float(norm_type)]


def partial(norm: float, norm_type: float) -> float:
    """One piece's share of the total, from that piece's own norm."""
    return norm if norm_type == INF else norm ** norm_type


def total(partials, norm_type: float) -> float:
    """The norm over all pieces from their partials."""
    if norm_type == INF:
        return max(partials, default=0.0)
    return sum(partials) ** (1.0 / norm_type)


def factor(total_norm: float, max_norm: float) -> float:
    """torch's clip coefficient: min(1, max_norm / (total + 1e-6)); a non-finite norm gives
    what torch's gives (nan or 0: torch scales the gradient by it all the same)."""
    coef = max_norm / (total_norm + EPS)
    return coef if coef < 1.0 else (1.0 if coef == coef else coef)


def said(value) -> str:
    """A setting (or None) as a script would have written it."""
    return "no clipping" if value is None else \
        f"clip_grad_norm_(max_norm={value[0]:g}, norm_type={value[1]:g})"
