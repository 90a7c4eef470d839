"""A SIGKILLed server: restarted from the latest checkpoint with exactly the rounds since lost,
or, with recovery off, the job stops naming it instead of hanging."""

import json
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

from paramserver.runlog.metrics import read_records, summarize
from paramserver.runlog.checkpoint import latest
from paramserver.launch.local import LaunchError, LocalCluster
from paramserver.client.kv import KVWorker
from ps_helpers import known_gradient, make_job

KEYS = 10  # two shards: [0, 5) and [5, 10)


def _job(tmp_path, **extra):
    return make_job(KEYS, 2, 1, sync="bsp", lr=1.0, retry_interval=0.3,
                    checkpoint={"dir": str(tmp_path / "ckpt"), "every": 2}, **extra)


def _server(cluster, rank: int):
    """The live server process holding shard `rank`: the one listening at its address."""
    events = (cluster.run_dir / "events.jsonl").read_text().splitlines()
    addr = next(e["addr"] for e in map(json.loads, events)
                if e["event"] == "server_joined" and e["rank"] == rank)
    port = int(addr.rsplit(":", 1)[1])
    for c in cluster.children:
        if c.role == "server" and c.proc.poll() is None and any(
                conn.laddr.port == port and conn.status == psutil.CONN_LISTEN
                for conn in psutil.Process(c.proc.pid).net_connections("tcp")):
            return c
    raise AssertionError(f"no live server listens at {addr}")


def _wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def _steps(kv, release, steps):
    for _ in range(steps):
        kv.pull(min_version=release.min_version)
        grad = known_gradient(kv.rank, release.step, KEYS, kv.dtype)
        kv.push(grad, step=release.step, batch=1)
        release = kv.clock(release.step, batch=1, compute_time=0.0)
    kv.pull(min_version=release.min_version)  # every round so far applied on both shards
    return release


def test_killed_server_restarts_from_the_checkpoint_and_loses_exactly_the_rounds_since(tmp_path):
    cluster = LocalCluster(_job(tmp_path), tmp_path / "run", job_timeout=120, restart_servers=1)
    supervisor = None
    try:
        cluster.start(spawn_workers=False)
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kv = KVWorker(cluster.address, keys=cluster.client_keys("worker"))
        try:
            kv.init(np.zeros(KEYS))
            release = _steps(kv, kv.start(), 5)  # rounds 0..4 applied; checkpoints at 2 and 4
            _wait_for(lambda: latest(tmp_path / "ckpt") == f"{4:09d}", "checkpoint 4")
            os.kill(_server(cluster, 1).proc.pid, signal.SIGKILL)  # round 4 is lost on shard 1
            release = _steps(kv, release, 5)  # retried until the restarted server answers
            final = kv.pull(min_version=release.min_version)
            assert kv.requests.retries >= 1
            kv.bye()
        finally:
            kv.close()
        supervisor.join(60)
        assert not supervisor.is_alive()
    finally:
        cluster.stop()
    grads = [known_gradient(0, s, KEYS, np.float64) for s in range(10)]
    expected = -sum(grads)
    expected[5:] += grads[4][5:]  # shard 1 restored to round 4: round 4's update is gone
    np.testing.assert_array_equal(final, expected)
    assert cluster.server_restarts == 1
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    restarts = [r for r in records if r["kind"] == "restart"]
    assert [(r["server"], r["checkpoint"], r["lost_updates"]) for r in restarts] == [
        (1, f"{4:09d}", 1)]
    summary = summarize(records, cluster.job)
    assert (summary["server_restarts"], summary["lost_updates"]) == (1, 1)


def test_without_recovery_a_dead_server_stops_the_job_naming_it(tmp_path):
    job = _job(tmp_path, server_timeout=1.0)
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=120)
    try:
        cluster.start(spawn_workers=False)
        kv = KVWorker(cluster.address, keys=cluster.client_keys("worker"))
        try:
            kv.init(np.zeros(KEYS))
            release = _steps(kv, kv.start(), 2)
            victim = _server(cluster, 1)
            os.kill(victim.proc.pid, signal.SIGKILL)
            kv.timeout = 2.0  # the worker gives up on the dead server, naming it
            with pytest.raises(TimeoutError, match=r"server 1 at tcp://[\d.:]+ did not answer"):
                kv.push(np.ones(KEYS), step=release.step, batch=1)
        finally:
            kv.close()
        coord = cluster.children[0]
        coord.proc.wait(30)
        assert coord.proc.returncode == 1 and "server s1" in coord.tail()
        with pytest.raises(LaunchError, match="server .* died .*--restart-servers"):
            cluster.wait()
    finally:
        cluster.stop()
