"""Worker process: join the job, run the task the job names, say goodbye."""

from __future__ import annotations

import json
import logging
import os

from paramserver.core.exits import Exit
from paramserver.training.tasks import load_task
from paramserver.client.kv import KVWorker

log = logging.getLogger(__name__)


def run_worker(join: str, result_dir: str | None = None, keys=None) -> int:
    kv = KVWorker(join, keys=keys)
    try:
        task = kv.spec.job.task
        result = load_task(task.name)(kv, task)
        if kv.left is None:  # a preempted worker has left already
            kv.bye()
    finally:
        kv.close()
    if result_dir and result is not None:
        os.makedirs(result_dir, exist_ok=True)
        with open(os.path.join(result_dir, f"worker-{kv.rank}.json"), "w") as f:
            json.dump(result, f)
    log.info("worker %d done: %s", kv.rank, result)
    # A drained worker says so: an orchestrator runs it again and it rejoins (core/exits.py).
    return Exit.PREEMPTED if kv.left == "preempted" else Exit.FINISHED
