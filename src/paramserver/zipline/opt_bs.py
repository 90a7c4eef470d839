"""ZipLineOptBS: ZipLineOpt whose n x R timestamp matrix turns finding the replaced element into a binary search."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from paramserver.zipline.timeline import merged
from paramserver.zipline.validate import PushTimes


def find_window(pt: PushTimes) -> tuple:
    """Return the optimal (spread, barrier).

    Z lives in the timeline itself: the slice times[head:p] minus tombstones, sorted by
    (time, worker). A new point (w, k) replaces (w, k-1), whose time the matrix gives; a binary
    search on time, then on worker inside the run of equal times, locates it. The ZipLineOpt
    prune (same colour as the leftmost) skips the search. O(N log N).
    """
    tl = merged(pt)
    times, workers, index = tl.times, tl.workers, tl.index
    matrix = [pt.row(i).tolist() for i in range(pt.n)]
    alive = bytearray(len(times))
    head, missing = 0, pt.n
    best_spread = best_barrier = None
    for p, w in enumerate(workers):
        k = index[p]
        if k == 0:
            missing -= 1
        elif workers[head] == w:
            alive[head] = 0
        else:
            t_old = matrix[w][k - 1]
            lo = bisect_left(times, t_old, head, p)
            hi = bisect_right(times, t_old, lo, p)
            alive[bisect_right(workers, w, lo, hi) - 1] = 0
        alive[p] = 1
        while not alive[head]:
            head += 1
        if missing:
            continue
        spread = times[p] - times[head]
        if best_spread is None or spread < best_spread:
            best_spread, best_barrier = spread, times[p]
    return best_spread, best_barrier
