"""ZipLine, vectorized with numpy: the default and fastest variant (one sort plus linear passes)."""

from __future__ import annotations

import numpy as np

from paramserver.zipline.validate import PushTimes


def find_window(pt: PushTimes) -> tuple:
    """Return the optimal (spread, barrier).

    For a window starting at time lo, the earliest barrier is cover(lo) = max over workers of
    their first point >= lo. A worker's first point >= lo is the successor of its last point
    < lo (or its first point), so cover(lo) = max(max_w first_w, max successor over all points
    < lo): a running maximum of successors in time order. Candidates lo are the distinct point
    times up to min_w last_w. cover is non-decreasing in lo, so the first minimum of
    cover(lo) - lo also has the earliest barrier. O(N log N) for the sort, O(N) otherwise.
    """
    v, off = pt.values, pt.offsets
    last = off[1:] - 1
    succ = np.empty_like(v)
    succ[:-1] = v[1:]
    # A row's last point has no successor; the global minimum is neutral for the running max.
    succ[last] = v.min()
    order = np.argsort(v)
    vs = v[order]
    reach = np.maximum.accumulate(succ[order])
    limit = v[last].min()
    first_of_run = np.empty(vs.size, dtype=bool)
    first_of_run[0] = True
    np.not_equal(vs[1:], vs[:-1], out=first_of_run[1:])
    starts = np.flatnonzero(first_of_run & (vs <= limit))
    base = v[off[:-1]].max()
    # starts[0] == 0 (the global minimum is never past `limit`): nothing lies before it.
    cover = np.maximum(reach[starts - 1], base)
    cover[0] = base
    spread = cover - vs[starts]
    best = int(np.argmin(spread))
    return spread[best], cover[best]
