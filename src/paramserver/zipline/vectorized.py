"""ZipLine, vectorized with numpy: the default and fastest variant (no Python loop over points)."""

from __future__ import annotations

import numpy as np

from paramserver.zipline.validate import PushTimes

# Integer times whose range is at most this many slots per point use the sort-free dense path;
# past that (or past _DENSE_MAX_SLOTS, 128 MB of int64) sorting is cheaper than the empty slots.
_DENSE_SLOTS_PER_POINT = 8
_DENSE_MAX_SLOTS = 2**24


def find_window(pt: PushTimes) -> tuple:
    """Return the optimal (spread, barrier).

    For a window starting at lo, the earliest barrier is cover(lo) = max over workers of
    their first point >= lo. That point is the successor of the worker's last point < lo
    (or its first point), so cover(lo) = max(max_w first_w, max of successors of all points
    < lo): a running maximum of successors in time order. Candidate starts are the distinct
    point times up to min_w last_w; cover is non-decreasing in lo, so the first minimum of
    cover(lo) - lo also has the earliest barrier (and the earliest start).
    Integer times over a compact range scatter into a dense timeline: O(N + range), no sort.
    Otherwise the points are sorted: O(N log N).
    """
    v, off = pt.values, pt.offsets
    succ = np.empty_like(v)
    succ[:-1] = v[1:]
    vmin = v.min()
    # A row's last point has no successor; the global minimum is neutral for a running max.
    succ[off[1:] - 1] = vmin
    base = v[off[:-1]].max()
    limit = v[off[1:] - 1].min()
    span = int(v.max()) - int(vmin) if v.dtype.kind == "i" else None
    if span is not None and span < min(_DENSE_SLOTS_PER_POINT * v.size + 1024, _DENSE_MAX_SLOTS):
        return _dense(v, succ, vmin, base, limit)
    return _sorted(v, succ, base, limit)


def _dense(v, succ, vmin, base, limit) -> tuple:
    x = v - vmin
    span = int(limit - vmin) + 1
    # Only starts up to `limit` are candidates, and cover needs points strictly before them.
    keep = x < span
    reach = np.full(span, -1, dtype=np.int64)
    np.maximum.at(reach, x[keep], succ[keep] - vmin)
    # Every kept point wrote a value >= 0 (even a last point: vmin - vmin), so this marks
    # exactly the times at which some point lies: the candidate starts.
    starts = np.flatnonzero(reach >= 0)
    np.maximum.accumulate(reach, out=reach)
    cover = np.maximum(reach[starts - 1], base - vmin)
    cover[0] = base - vmin  # starts[0] == 0: nothing lies before the global minimum
    spread = cover - starts
    best = int(np.argmin(spread))
    return spread[best], cover[best] + vmin


def _sorted(v, succ, base, limit) -> tuple:
    # Rows are sorted runs, which the stable sort (timsort) merges instead of re-sorting.
    order = np.argsort(v, kind="stable")
    vs = v[order]
    reach = np.maximum.accumulate(succ[order])
    first_of_run = np.empty(vs.size, dtype=bool)
    first_of_run[0] = True
    np.not_equal(vs[1:], vs[:-1], out=first_of_run[1:])
    starts = np.flatnonzero(first_of_run & (vs <= limit))
    cover = np.maximum(reach[starts - 1], base)
    cover[0] = base  # starts[0] == 0: the global minimum is never past `limit`
    spread = cover - vs[starts]
    best = int(np.argmin(spread))
    return spread[best], cover[best]
