"""ZipLineOpt: ZipLine that skips the search when a new point has the colour of Z's leftmost element."""

from __future__ import annotations

from collections import deque

from paramserver.zipline.timeline import merged
from paramserver.zipline.validate import PushTimes


def find_window(pt: PushTimes) -> tuple:
    """Return the optimal (spread, barrier).

    Points arrive in time order, so a new point always enters Z on the right: Z is a queue
    with deletions. If the new point's colour is the leftmost's, the element to replace is the
    leftmost (pop it, no search); otherwise the colour map finds it and it is tombstoned.
    O(N log N) for the merge, O(N) for the sweep.
    """
    tl = merged(pt)
    times, workers = tl.times, tl.workers
    newest = [-1] * pt.n
    dead = bytearray(len(times))
    z: deque[int] = deque()
    missing = pt.n
    best_spread = best_barrier = None
    for p, w in enumerate(workers):
        old = newest[w]
        newest[w] = p
        z.append(p)
        if old < 0:
            missing -= 1
        elif workers[z[0]] == w:
            z.popleft()
            while dead[z[0]]:
                z.popleft()
        else:
            dead[old] = 1
        if missing:
            continue
        spread = times[p] - times[z[0]]
        if best_spread is None or spread < best_spread:
            best_spread, best_barrier = spread, times[p]
    return best_spread, best_barrier
