"""Baseline: the textbook k-pointer heap sweep for the smallest range covering one point per list."""

from __future__ import annotations

from heapq import heapify, heapreplace

from paramserver.zipline.validate import PushTimes


def find_window(pt: PushTimes) -> tuple:
    """Return the optimal (spread, barrier).

    A heap holds each worker's current point (ordered by (time, worker)); pop the smallest,
    record [smallest, current max], advance that worker. Stops when a worker runs out.
    O(N log n).
    """
    rows = [pt.row(i).tolist() for i in range(pt.n)]
    heap = [(row[0], i) for i, row in enumerate(rows)]
    heapify(heap)
    cursor = [0] * pt.n
    top = max(row[0] for row in rows)
    best_spread = best_barrier = None
    while True:
        t, w = heap[0]
        spread = top - t
        # `top` never decreases, so the first smallest spread also has the earliest barrier.
        if best_spread is None or spread < best_spread:
            best_spread, best_barrier = spread, top
        k = cursor[w] + 1
        if k == len(rows[w]):
            return best_spread, best_barrier
        cursor[w] = k
        nxt = rows[w][k]
        if nxt > top:
            top = nxt
        heapreplace(heap, (nxt, w))
