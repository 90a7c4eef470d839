"""The demo task: each worker pushes known gradients and checks what it pulls back."""

from __future__ import annotations

import time

import numpy as np

from paramserver.client.kv import KVWorker
from paramserver.spec.job import TaskSpec


def run(kv: KVWorker, task: TaskSpec) -> dict:
    """Push a constant gradient of (rank + 1) for `steps` steps (a task option, 20 if not
    given); return counts and timings."""
    steps = int(task.options.get("steps", 20))
    if kv.rank == 0:
        kv.init(np.zeros(kv.num_keys, dtype=kv.dtype))
    release = kv.start()
    grad = np.full(kv.num_keys, kv.rank + 1, dtype=kv.dtype)
    params = np.empty(kv.num_keys, dtype=kv.dtype)
    t0, staleness = time.perf_counter(), []
    for _ in range(steps):
        kv.pull(out=params, min_version=release.min_version)
        staleness.append(kv.push(grad, step=release.step, batch=release.batch_size))
        release = kv.clock(release.step, batch=release.batch_size, compute_time=0.0)
    elapsed = time.perf_counter() - t0
    return {"rank": kv.rank, "steps": steps, "seconds": elapsed,
            "steps_per_s": steps / elapsed if elapsed else 0.0,
            "max_staleness": max(staleness, default=0), "last_value": float(params[0])}
