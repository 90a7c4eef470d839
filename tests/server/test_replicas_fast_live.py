"""The faster promotion against real processes (slow): a shard's primary is SIGKILLed while KV
workers push; its backup's socket monitor sees the connection drop and says so, the
coordinator promotes it after 2 heartbeat intervals (not the heartbeat timeout), and the
promoted server goes on serving: pushes are acknowledged and a new backup is synced from it.
Plaintext and CURVE (where the backup's watch must leave the CURVE guard's monitor alone).
The same logic on the pure core is tests/server/test_replicas_fast.py."""

import contextlib
import os
import signal
import threading

import numpy as np
import pytest

from paramserver.client.kv import KVWorker
from paramserver.launch.local import LocalCluster
from ps_helpers import make_job, run_events, server_listening_at, start_together, wait_for

pytestmark = pytest.mark.slow

KEYS = 200


@contextlib.contextmanager
def _cluster(tmp_path, job, curve: bool):
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=120,
                           keys="ephemeral" if curve else None)
    try:
        cluster.start(spawn_workers=False)
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize("curve", [False, True], ids=["plaintext", "curve"])
def test_a_killed_primary_is_promoted_away_on_its_backups_word(tmp_path, curve):
    # heartbeat interval 0.2 s (make_job): promoted after 0.4 s of silence, the timeout is 4 s
    job = make_job(KEYS, 2, 2, sync="asp", replicas=2, retry_interval=0.5,
                   heartbeat_timeout=4.0)
    with _cluster(tmp_path, job, curve) as cluster:
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kvs = [KVWorker(cluster.address, keys=cluster.client_keys("worker"))
               for _ in range(2)]
        acked, errors, stop = [0, 0], [], threading.Event()

        def push(i, kv):
            try:
                step = 0
                while not stop.is_set():
                    kv.push(np.ones(KEYS), step=step, batch=1)
                    acked[i] += 1
                    step += 1
            except Exception as exc:  # noqa: BLE001 (reported by the test)
                errors.append(exc)
        threads = []
        try:
            kvs[0].init(np.zeros(KEYS))
            start_together(kvs)
            threads = [threading.Thread(target=push, args=(i, kv)) for i, kv in enumerate(kvs)]
            for t in threads:
                t.start()
            wait_for(lambda: sum(acked) >= 40, "40 acknowledged pushes")
            primary = next(e["addr"] for e in run_events(cluster.run_dir)
                           if e["event"] == "server_joined" and e["rank"] == 1)
            os.kill(server_listening_at(cluster, primary).proc.pid, signal.SIGKILL)
            wait_for(lambda: any(e["event"] == "replica_promoted"
                                 for e in run_events(cluster.run_dir)), "the promotion")
            before = sum(acked)
            # the promoted server serves on (its monitor off: it must not stall its ROUTER)
            wait_for(lambda: sum(acked) >= before + 40, "pushes after the takeover")
            wait_for(lambda: any(e["event"] == "backup_rebuilt"
                                 for e in run_events(cluster.run_dir)), "a rebuilt backup")
            stop.set()
            for t in threads:
                t.join(60)
            assert not errors, errors
            assert np.array_equal(kvs[0].pull(), -np.full(KEYS, float(sum(acked))))
            for kv in kvs:
                kv.bye()
        finally:
            stop.set()
            for kv in kvs:
                kv.close()
        supervisor.join(60)
    events = run_events(cluster.run_dir)
    kinds = [e["event"] for e in events]
    assert kinds.index("primary_suspected") < kinds.index("replica_promoted")
    promoted = next(e for e in events if e["event"] == "replica_promoted")
    assert promoted["after"] == "link_down" and promoted["silent_s"] < 4.0
