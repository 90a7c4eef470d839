"""A worker SIGKILLed mid-run is replaced: the newcomer takes its rank and shard and trains on."""

import os
import signal

import pytest

from paramserver.launch.jobs import prepare_job
from paramserver.spec.config import TrainConfig
from paramserver.runlog.metrics import read_records
from paramserver.launch.local import LocalCluster
from ps_helpers import steps_after_the_death


# In the slow set (38 s; the default suite is at its budget). A SIGKILLed worker replaced in
# a live job that finishes and still learns is checked by default in tests/launch/test_chaos.py
# (test_chaos_asp_with_a_worker_a_server_and_the_coordinator_killed), the replacement's
# rank and its joining the running round on the pure core in tests/coordinator/test_coordinator_core.py
# and tests/coordinator/test_coordinator_takeback.py.
@pytest.mark.slow
def test_killed_worker_is_replaced_and_the_job_finishes(tmp_path):
    cfg = TrainConfig(sync="bsp", workers=3, epochs=12, heartbeat_timeout=2.0, device_time="2ms",
                      eval_interval=1.0, restart_workers=1)
    job = prepare_job(cfg)
    cluster = LocalCluster(job, tmp_path, job_timeout=300, restart_workers=1)
    events = tmp_path / "events.jsonl"
    killed = []

    def kill_once():
        if killed or not events.exists() or events.read_text().count("apply_round") < 20:
            return
        victim = next(c for c in cluster.children if c.role == "worker" and c.index == 1)
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed.append(victim.proc.pid)

    cluster.run(on_tick=kill_once)
    assert killed and cluster.restarts == 1
    records = read_records(tmp_path / "metrics.jsonl")
    later = steps_after_the_death(records)
    assert later, "the replacement never trained"
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals[-1]["accuracy"] >= 0.9
