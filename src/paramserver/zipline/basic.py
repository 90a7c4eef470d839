"""ZipLine: sweep the merged timeline keeping the newest point of each worker in an ordered set Z."""

from __future__ import annotations

from heapq import heappop, heappush

from paramserver.zipline.timeline import merged
from paramserver.zipline.validate import PushTimes


def find_window(pt: PushTimes) -> tuple:
    """Return the optimal (spread, barrier).

    Z is a binary heap of timeline positions (position order is (time, worker) order); the
    colour map `newest` finds the element a new point replaces, which is then deleted lazily.
    O(N log N) for N = total points.
    """
    tl = merged(pt)
    times, workers = tl.times, tl.workers
    newest = [-1] * pt.n
    z: list[int] = []
    missing = pt.n
    best_spread = best_barrier = None
    for p, w in enumerate(workers):
        if newest[w] < 0:
            missing -= 1
        newest[w] = p
        heappush(z, p)
        if missing:
            continue
        while newest[workers[z[0]]] != z[0]:
            heappop(z)
        spread = times[p] - times[z[0]]
        # Barriers arrive in time order, so keeping the first smallest spread keeps the earliest.
        if best_spread is None or spread < best_spread:
            best_spread, best_barrier = spread, times[p]
    return best_spread, best_barrier
