"""The search result (SyncPlan) and the one rule that turns a window into per-worker sync indices."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paramserver.zipline.validate import PushTimes


@dataclass(frozen=True)
class SyncPlan:
    """Where every worker synchronizes.

    spread: barrier - low, the smallest possible max - min over one chosen time per worker.
    barrier: the latest chosen time (the barrier); among equal spreads the earliest barrier wins,
        then the earliest low.
    low: the earliest chosen time.
    sync_index: per worker (input order), the index of its chosen predicted push: the LAST one at
        or before the barrier, so each worker keeps computing as long as possible and idles least.
    """

    spread: int | float
    barrier: int | float
    low: int | float
    sync_index: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"spread": self.spread, "barrier": self.barrier, "low": self.low,
                "sync_index": list(self.sync_index)}


def make_plan(pt: PushTimes, spread, barrier) -> SyncPlan:
    """Build the canonical plan from an optimal (spread, barrier) found by any variant."""
    v = pt.values
    inside = v <= barrier
    # With floats, barrier - t can round to the optimal spread for several starts t; the tie rule
    # wants the earliest, and any such t is feasible (it lies at or before the sweep's start).
    starts = v[inside & ((barrier - v) == spread)]
    if starts.size == 0:
        raise AssertionError("variant returned a window that starts at no push time")
    counts = np.add.reduceat(inside.astype(np.int64), pt.offsets[:-1])
    if np.any(counts == 0):
        raise AssertionError("variant returned a barrier before some worker's first push")
    return SyncPlan(spread=pt.scalar(spread), barrier=pt.scalar(barrier),
                    low=pt.scalar(starts.min()), sync_index=tuple((counts - 1).tolist()))
