"""ZipLine: choose one predicted push time per worker so that the spread max - min is smallest.

This is the synchronization-point search of ElasticBSP (Zhao et al., "ZipLine: an optimized
algorithm for the elastic bulk synchronous parallel model", Machine Learning 2021).

    >>> from paramserver.zipline import search
    >>> plan = search([[0, 10, 20], [4, 12], [11, 30]])
    >>> plan.spread, plan.barrier, plan.low, plan.sync_index
    (2, 12, 10, (1, 1, 0))

Input: an n x R array, or one sorted sequence per worker (lengths may differ); ints stay
int64 and are exact, anything else becomes float64. Empty, unsorted or non-finite input raises
ZiplineInputError (a ValueError).

Rule (every variant returns the same SyncPlan):
- points are ordered by (time, worker id, index);
- the spread is minimal; among equal spreads the earliest barrier (max) wins, then the
  earliest low (min);
- worker i synchronizes at sync_index[i] = its LAST predicted push at or before the barrier
  (it lies inside [low, barrier]; the last one leaves the worker the least idle time).

Variants (the VARIANTS registry maps name -> function(PushTimes) -> (spread, barrier)):
- "zipline-vec" (default): numpy running-maximum formulation, O(N log N), N = sum of lengths;
- "zipline": merged-timeline sweep, Z an ordered set (heap) keeping each worker's newest point;
- "zipline-opt": ZipLine that skips the search when the new point has the leftmost's colour;
- "zipline-opt-bs": ZipLineOpt with the n x R matrix turning the search into a binary search;
- "heap": the textbook k-pointer heap sweep, kept as a baseline.
"""

from __future__ import annotations

from collections.abc import Callable

from paramserver.core.registry import Registry
from paramserver.zipline import basic, heap_baseline, opt, opt_bs, vectorized
from paramserver.zipline.plan import SyncPlan, make_plan
from paramserver.zipline.validate import PushTimes, ZiplineInputError, validate

__all__ = ["DEFAULT_VARIANT", "VARIANTS", "PushTimes", "SyncPlan", "ZiplineInputError",
           "get_variant", "search", "validate"]

VARIANTS: Registry[Callable[[PushTimes], tuple]] = Registry("ZipLine variant")
VARIANTS.register("zipline-vec")(vectorized.find_window)
VARIANTS.register("zipline")(basic.find_window)
VARIANTS.register("zipline-opt")(opt.find_window)
VARIANTS.register("zipline-opt-bs")(opt_bs.find_window)
VARIANTS.register("heap")(heap_baseline.find_window)
DEFAULT_VARIANT = "zipline-vec"


def get_variant(name: str) -> Callable[[PushTimes], tuple]:
    """Look a variant up by name; an unknown name fails with the list of known ones."""
    return VARIANTS.get(name)


def search(times, variant: str = DEFAULT_VARIANT) -> SyncPlan:
    """Find the synchronization window of n workers' predicted push times (see module doc)."""
    find_window = get_variant(variant)
    pt = validate(times)
    spread, barrier = find_window(pt)
    return make_plan(pt, spread, barrier)
