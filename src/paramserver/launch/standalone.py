"""A script run with plain `python` (no join address, not under `paramserver launch`): a job of
one worker on this host, as Horovod's `hvd.init()` without horovodrun makes a world of one.

Its coordinator and one shard start from the script's process on first use, on loopback, each
as its own interpreter (a fork server would import the script's `__main__` again), with the
defaults `launch` gives a script (BSP; the script's own optimizer runs on the shard). RANK,
WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE are set as torchrun sets them for one process,
where the script did not set them. The roles die with the script's process; at its exit,
after its optimizer left, they are reaped (`stop`). The run folder keeps their logs, events
and metrics, as a launch's does.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

_cluster = None


def join_address() -> str:
    """The address of this process's own one-worker job, started on the first call."""
    global _cluster
    if _cluster is None:
        from paramserver.launch.jobs import script_job
        from paramserver.launch.local import LocalCluster
        from paramserver.spec.config import TrainConfig
        run_dir = Path(f"runs/{time.strftime('%Y%m%d-%H%M%S')}-script-{os.getpid()}")
        try:
            run_dir.mkdir(parents=True)
        except OSError:  # a working folder it may not write: the run goes to a temporary one
            run_dir = Path(tempfile.mkdtemp(prefix="paramserver-script-"))
        cluster = LocalCluster(script_job(TrainConfig(workers=1, servers=1)), run_dir,
                               keys=None, fork=False)
        print(f"paramserver: no job to join (not under `paramserver launch`): this script runs "
              f"as a job of one worker on this host, with no step budget (a loop over "
              f"paramserver.BatchSampler runs until Ctrl-C; `paramserver launch --steps N -- "
              f"python SCRIPT` sets one); its run folder is {run_dir}",
              file=sys.stderr, flush=True)
        try:
            cluster.start(spawn_workers=False)
        except BaseException:
            cluster.stop()
            raise
        _cluster = cluster
        for name, value in cluster.worker_env(0).items():
            os.environ.setdefault(name, value)
    return _cluster.address


def stop(finished: bool = True, grace: float = 10.0) -> None:
    """Reap the job's roles: once its worker has left (`finished`: the coordinator then ends
    the job, and they exit on their own within `grace`), or at once when none ever joined
    (the script ended before its optimizer did: nothing waits at the start barrier)."""
    global _cluster
    cluster, _cluster = _cluster, None
    if cluster is None:
        return
    if finished:
        cluster.finish(grace)
    else:
        cluster.stop(grace=2.0)
