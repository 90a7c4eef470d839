"""Replicated shards against real processes: the primary of a shard is SIGKILLed while 4 KV
workers push known integer gradients; its backup takes over, and the final values are exactly
the sum of every acknowledged push (none lost, none applied twice). The same logic on the pure
cores runs in the default suite (tests/server/test_replicas.py)."""

import json
import os
import signal
import threading

import numpy as np
import pytest

from paramserver.client.kv import KVWorker
from paramserver.runlog.metrics import read_records, summarize
from ps_helpers import (known_gradient, make_job, running_job, run_events, server_listening_at,
                        start_together, wait_for)

pytestmark = pytest.mark.slow

KEYS = 1000  # two shards
# Two shards of 80 KB (float64): each forward's array goes through the primary's shared arena
# (above transport.shm.MIN_BYTES); KEYS' go over the socket.
SHARED_KEYS = 20_000
WORKERS = 4


def _happened(cluster, event: str) -> bool:
    return any(e["event"] == event for e in run_events(cluster.run_dir))


def _pusher(kv: KVWorker, stop: threading.Event, acked: list, errors: list):
    try:
        step = 0
        while not stop.is_set():
            grad = known_gradient(kv.rank, step, kv.num_keys, kv.dtype)
            kv.push(grad, step=step, batch=1)
            acked.append(grad)  # acknowledged: the shards (both copies) hold it
            step += 1
    except Exception as exc:  # noqa: BLE001 (reported by the test)
        errors.append(exc)


@pytest.mark.parametrize("keys", [KEYS, SHARED_KEYS], ids=["socket", "shared-memory"])
def test_killed_primary_is_replaced_by_its_backup_with_no_update_lost_or_doubled(tmp_path, keys):
    job = make_job(keys, 2, WORKERS, sync="asp", replicas=2, retry_interval=0.5,
                   heartbeat_timeout=1.5)
    with running_job(tmp_path, job) as cluster:
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kvs = [KVWorker(cluster.address) for _ in range(WORKERS)]
        init = np.arange(keys, dtype=np.float64)
        acked = [[] for _ in kvs]
        errors: list = []
        stop = threading.Event()
        try:
            kvs[0].init(init)
            start_together(kvs)
            assert {e["rank"] for e in run_events(cluster.run_dir)
                    if e["event"] == "backup_synced"} == {0, 1}
            threads = [threading.Thread(target=_pusher, args=(kv, stop, a, errors))
                       for kv, a in zip(kvs, acked)]
            for t in threads:
                t.start()
            wait_for(lambda: sum(map(len, acked)) >= 80, "80 acknowledged pushes")
            primary = next(e["addr"] for e in run_events(cluster.run_dir)
                           if e["event"] == "server_joined" and e["rank"] == 1)
            os.kill(server_listening_at(cluster, primary).proc.pid, signal.SIGKILL)
            before = sum(map(len, acked))
            wait_for(lambda: _happened(cluster, "replica_promoted"), "the backup's promotion")
            wait_for(lambda: sum(map(len, acked)) >= before + 80, "pushes after the takeover")
            wait_for(lambda: _happened(cluster, "backup_rebuilt"),
                     "a new backup rebuilt from the survivor")
            wait_for(lambda: sum(map(len, acked)) >= before + 160, "pushes after the rebuild")
            stop.set()
            for t in threads:
                t.join(60)
            assert not errors, errors
            final = kvs[0].pull()
            expected = init - sum(g for a in acked for g in a)  # sgd, lr 1
            np.testing.assert_array_equal(final, expected)
            for kv in kvs:
                kv.bye()
        finally:
            stop.set()
            for kv in kvs:
                kv.close()
        supervisor.join(60)
    events = run_events(cluster.run_dir)
    promoted = [e for e in events if e["event"] == "replica_promoted"]
    assert [e["rank"] for e in promoted] == [1]
    assert not [e for e in events if e["event"] in ("server_restored", "server_lost")]
    summary = summarize(read_records(cluster.run_dir / "metrics.jsonl"), cluster.job)
    assert (summary["server_restarts"], summary["lost_updates"],
            summary["replica_promotions"]) == (0, 0, 1)


def test_chaos_with_replicas_a_primary_killed_mid_training_loses_nothing(tmp_path):
    """benchmarks/chaos.py with --replicas 2 (ASP, a worker and a shard's primary SIGKILLed):
    the backup takes over, a new one is rebuilt, the job reaches its accuracy, nothing lost."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "chaos", Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py")
    chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    r = chaos.chaos_run("asp", tmp_path, seed=0, worker_kills=1, replicas=2)
    print(json.dumps(r))
    assert r["server_kill"] is not None and r["server_restarts"] == 0, r
    assert (r["lost_updates"], r["promotions"]) == (0, 1), r
    assert r["membership"][:2] == ["replica_promoted", "backup_rebuilt"], r
    assert r["best_accuracy_after_restart"] >= 0.88 and r["final_accuracy"] >= 0.7, r


class RestartablePushers:
    """A --replicas 2 --restart-coordinator job of real processes with WORKERS KV clients
    pushing known integer gradients (ASP, SGD lr 1) from the moment both backups are synced;
    `finish()` stops them and checks the final values are the initial ones less every
    acknowledged push. Everything is stopped and reaped on exit (bounded)."""

    def __init__(self, tmp_path):
        from paramserver.launch.local import LocalCluster
        # (A wide heartbeat timeout: the clients share this busy process through a restart,
        # and the stall doctor, which the restarted coordinator would point at clients that
        # never clock, is kept quiet.)
        job = make_job(KEYS, 2, WORKERS, sync="asp", replicas=2, retry_interval=0.5,
                       heartbeat_timeout=3.0, coordinator_timeout=30.0, stall_timeout=120.0)
        self.cluster = LocalCluster(job, tmp_path / "run", job_timeout=120, keys=None,
                                    restart_coordinator=1)
        self.failures: list = []
        self.errors: list = []
        self.kvs: list = []
        self.stop = threading.Event()
        self.acked: list = [[] for _ in range(WORKERS)]
        self.init = np.arange(KEYS, dtype=np.float64)

    def _supervise(self):
        from paramserver.launch.local import LaunchError
        try:
            self.cluster.wait()
        except LaunchError as exc:
            self.failures.append(exc)

    def __enter__(self) -> "RestartablePushers":
        cluster = self.cluster
        cluster.start(spawn_workers=False)
        self.supervisor = threading.Thread(target=self._supervise, daemon=True)
        self.supervisor.start()
        self.kvs = [KVWorker(cluster.address) for _ in range(WORKERS)]
        self.kvs[0].init(self.init)
        start_together(self.kvs)
        wait_for(lambda: {e["rank"] for e in run_events(cluster.run_dir)
                          if e["event"] == "backup_synced"} == {0, 1}, "synced backups")
        self.servers = {c.proc.pid for c in cluster.children if c.role == "server"}
        self.threads = [threading.Thread(target=_pusher, args=(kv, self.stop, a, self.errors))
                        for kv, a in zip(self.kvs, self.acked)]
        for t in self.threads:
            t.start()
        return self

    def more(self, n: int, what: str, timeout: float = 60.0) -> None:
        before = sum(map(len, self.acked))
        wait_for(lambda: sum(map(len, self.acked)) >= before + n, what, timeout=timeout)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not self.errors, self.errors
        final = self.kvs[0].pull()
        np.testing.assert_array_equal(final, self.init - sum(g for a in self.acked for g in a))
        for kv in self.kvs:
            kv.bye()
        self.supervisor.join(60)
        assert not self.supervisor.is_alive() and not self.failures, self.failures

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for kv in self.kvs:
            kv.close()
        self.cluster.stop()


def test_a_restarted_coordinator_keeps_the_backups_and_a_later_primary_kill_loses_nothing(
        tmp_path):
    """--replicas 2 with --restart-coordinator: the coordinator is SIGKILLed mid-stream and
    restarted (--take-back); both backups are taken back as their primaries' (same processes,
    events say so), then a primary is SIGKILLed: its backup takes over with nothing lost."""
    with RestartablePushers(tmp_path) as job:
        cluster = job.cluster
        job.more(80, "80 acknowledged pushes")
        first = cluster.coordinator
        os.kill(first.proc.pid, signal.SIGKILL)
        wait_for(lambda: {e["rank"] for e in run_events(cluster.run_dir)
                          if e["event"] == "backup_taken_back"} == {0, 1},
                 "both backups taken back by the restarted coordinator")
        assert first.proc.returncode == -signal.SIGKILL and cluster.coordinator is not first
        job.more(80, "pushes after the take-back")
        # Every server process of the start serves on: no backup exited or was rebuilt.
        assert {c.proc.pid for c in cluster.children
                if c.role == "server" and c.proc.poll() is None} == job.servers
        primary = next(e["addr"] for e in run_events(cluster.run_dir)
                       if e["event"] == "server_taken_back" and e["rank"] == 1)
        os.kill(server_listening_at(cluster, primary).proc.pid, signal.SIGKILL)
        wait_for(lambda: _happened(cluster, "replica_promoted"), "the backup's promotion")
        job.more(80, "pushes after the takeover")
        # The new backup is attached after every epoch the old coordinator gave out.
        rebuilt = wait_for(lambda: [e for e in run_events(cluster.run_dir)
                                    if e["event"] == "backup_rebuilt"], "a rebuilt backup")
        assert rebuilt[0]["rank"] == 1
        job.more(80, "pushes after the rebuild")
        job.finish()
    events = run_events(cluster.run_dir)
    kinds = [e["event"] for e in events]
    assert "backup_not_taken_back" not in kinds, events
    taken = [e for e in events if e["event"] == "backup_taken_back"]
    assert all(e["synced"] for e in taken), taken
    assert kinds.index("replica_promoted") > kinds.index("taken_back")
    assert [e["rank"] for e in events if e["event"] == "replica_promoted"] == [1]
    summary = summarize(read_records(cluster.run_dir / "metrics.jsonl"), cluster.job)
    assert (summary["lost_updates"], summary["replica_promotions"]) == (0, 1)


def test_a_primary_killed_with_the_coordinator_is_replaced_by_its_backup_losing_nothing(
        tmp_path):
    """--replicas 2 with --restart-coordinator: the coordinator and one primary are SIGKILLed
    together. The restarted coordinator reads in the dead one's events.jsonl that the
    primary's backup was synced and never dropped, so it promotes that backup when the primary
    does not come back; the workers follow and the final values are exactly the initial ones
    less every acknowledged push."""
    with RestartablePushers(tmp_path) as job:
        cluster = job.cluster
        job.more(80, "80 acknowledged pushes")
        primary = next(e["addr"] for e in run_events(cluster.run_dir)
                       if e["event"] == "server_joined" and e.get("rank") == 1)
        os.kill(server_listening_at(cluster, primary).proc.pid, signal.SIGKILL)
        os.kill(cluster.coordinator.proc.pid, signal.SIGKILL)
        promoted = wait_for(lambda: [e for e in run_events(cluster.run_dir)
                                     if e["event"] == "replica_promoted"],
                            "the backup promoted by the restarted coordinator", timeout=90)
        assert promoted[0]["rank"] == 1 and "restarted coordinator" in promoted[0]["after"]
        job.more(80, "pushes after the takeover", timeout=90)
        job.finish()
    kinds = [e["event"] for e in run_events(cluster.run_dir)]
    assert "taken_back" in kinds and "job_failed" not in kinds
