"""The merged timeline of all predicted pushes, ordered by (time, worker id, index), for the sweeps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paramserver.zipline.validate import PushTimes


@dataclass(frozen=True)
class Timeline:
    """Parallel Python lists (the sweeps are Python loops; list indexing beats numpy scalars)."""

    times: list
    workers: list[int]
    index: list[int]


def worker_of_each(pt: PushTimes) -> np.ndarray:
    return np.repeat(np.arange(pt.n, dtype=np.int64), pt.lengths)


def merged(pt: PushTimes) -> Timeline:
    # The flat layout is worker-major and index-minor, so a stable sort by time alone yields
    # the (time, worker id, index) order that the tie rule asks for.
    order = np.argsort(pt.values, kind="stable")
    w = worker_of_each(pt)
    k = np.arange(pt.values.size, dtype=np.int64) - np.repeat(pt.offsets[:-1], pt.lengths)
    return Timeline(times=pt.values[order].tolist(), workers=w[order].tolist(),
                    index=k[order].tolist())

