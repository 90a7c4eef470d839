"""A replicated shard whose primary is gone before its backup synced, against real processes
(`--replicas 2`; the pure logic is tests/coordinator/test_orphaned_shards.py).

The job's backups are held back at the start (the test starts them through the launcher's own
`_rebuild_backup`), which makes "before the backup synced" deterministic:

- `silent`: shard 1's primary is SIGSTOPped before its backup registers, so the attach never
  reaches it, and then SIGKILLed (as Ray's node loss killed it during start-up);
- `never registered`: shard 1's primary is never started, as if it died before it registered,
  and the replacement the launcher starts for a dead server registers as another backup (what
  the coordinator used to refuse: "every one of the shards has its backup").

Either way the job recovers before training, nothing lost: the backup takes the shard over,
the worker's init reaches it, the next backup syncs from it, training runs and every
acknowledged push is in the final values; the job then ends normally. Before the fix the
init (or the registration) waited for the start timeout.

Mid-job (the last test), a rebuilt backup not synced yet takes over from the latest
checkpoint, losing exactly the round its primary applied alone, counted.
"""

import os
import signal

import numpy as np
import pytest

from paramserver.client.kv import KVWorker
from paramserver.launch.local import LocalCluster
from ps_helpers import (
    known_gradient, make_job, run_events, server_listening_at, supervised, wait_for,
)

KEYS = 400  # two shards
STEPS = 10


class HeldBack(LocalCluster):
    """A LocalCluster whose start() spawns no backup, nor the primary of rank `skip`."""

    skip: int | None = None

    def _spawn_server(self, index: int, backup: bool = False):
        if not self.address and (backup or index == self.skip):
            return None
        return super()._spawn_server(index, backup)


def _events(cluster, kind: str) -> list[dict]:
    return [e for e in run_events(cluster.run_dir) if e["event"] == kind]


@pytest.mark.parametrize("how", ["silent", "never_registered"])
def test_a_primary_lost_before_its_backup_synced_is_taken_over_before_training(tmp_path, how):
    job = make_job(KEYS, 2, 1, sync="asp", replicas=2, retry_interval=0.3,
                   heartbeat_timeout=1.5, start_timeout=60.0)
    cluster = HeldBack(job, tmp_path / "run", job_timeout=90, keys=None)
    cluster.skip = 1 if how == "never_registered" else None
    supervisor, failures = supervised(cluster, start=False)
    kv = None
    try:
        cluster.start(spawn_workers=False)
        if how == "silent":
            wait_for(lambda: len(_events(cluster, "server_joined")) == 2, "both primaries")
            p1 = next(e["addr"] for e in _events(cluster, "server_joined") if e["rank"] == 1)
            stopped = server_listening_at(cluster, p1).proc
            os.kill(stopped.pid, signal.SIGSTOP)  # the attach never reaches it
            cluster._rebuild_backup()
            cluster._rebuild_backup()
            wait_for(lambda: {e["rank"] for e in _events(cluster, "backup_joined")} == {0, 1},
                     "both backups registered")
            assert not any(e["rank"] == 1 for e in _events(cluster, "backup_synced"))
            supervisor.start()  # (from here the launcher replaces dead servers by backups)
            os.kill(stopped.pid, signal.SIGKILL)
        else:
            wait_for(lambda: len(_events(cluster, "server_joined")) == 1, "primary 0")
            for rank in (0, 1):  # rank 1's waits for a primary that never comes
                cluster._rebuild_backup()
                wait_for(lambda: rank in {e["rank"] for e in _events(cluster, "backup_joined")},
                         f"backup {rank} registered")
            assert not any(e["rank"] == 1 for e in _events(cluster, "backup_synced"))
            cluster._rebuild_backup()  # what the launcher starts for a dead server
            wait_for(lambda: _events(cluster, "replica_promoted"), "the stand-in", timeout=30)
            supervisor.start()

        kv = KVWorker(cluster.address, timeout=30.0)
        init = np.arange(KEYS, dtype=np.float64)
        kv.init(init)  # answered once shard 1's successor and its new backup hold it
        kv.start()
        sent = []
        for step in range(STEPS):
            grad = known_gradient(0, step, KEYS, np.float64)
            kv.push(grad, step=step, batch=1)
            sent.append(grad)
        np.testing.assert_array_equal(kv.pull(min_version=0), init - sum(sent))  # sgd, lr 1
        kv.bye()
        supervisor.join(60)
        assert not supervisor.is_alive() and not failures, failures
    finally:
        if kv is not None:
            kv.close()
        cluster.stop()
        if supervisor.ident is not None:
            supervisor.join(10)

    events = run_events(cluster.run_dir)
    [promoted] = [e for e in events if e["event"] == "replica_promoted"]
    assert promoted["rank"] == 1 and "checkpoint" not in promoted
    assert promoted["old_addr"] == (p1 if how == "silent" else None)
    assert {e["rank"] for e in events if e["event"] == "backup_synced"} == {0, 1}
    assert not [e for e in events if e["event"] in ("job_failed", "server_restored")]
    assert cluster.coordinator.proc.returncode == 0


def _steps(kv, release, steps):
    """`steps` BSP steps of known gradients (as tests/server/test_server_recovery.py)."""
    for _ in range(steps):
        kv.pull(min_version=release.min_version)
        grad = known_gradient(kv.rank, release.step, 10, kv.dtype)
        kv.push(grad, step=release.step, batch=1)
        release = kv.clock(release.step, batch=1, compute_time=0.0)
    kv.pull(min_version=release.min_version)
    return release


def test_mid_job_a_backup_not_synced_takes_over_from_the_latest_checkpoint(tmp_path):
    """Shard 1's backup dies; round 4 is applied by its primary alone; the primary is
    SIGSTOPped before the rebuilt backup's attach reaches it, then killed. The rebuilt backup
    is promoted from checkpoint 4, exactly round 4 is lost on shard 1 (and counted), and
    training goes on to its end. (No supervisor: the test starts the one rebuilt backup.)"""
    from paramserver.runlog.checkpoint import latest
    from paramserver.runlog.metrics import read_records, summarize
    job = make_job(10, 2, 1, sync="bsp", replicas=2, retry_interval=0.3,
                   heartbeat_timeout=2.0, checkpoint={"dir": str(tmp_path / "ckpt"), "every": 2})
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=90, keys=None)
    kv = None
    try:
        cluster.start(spawn_workers=False)
        kv = KVWorker(cluster.address, timeout=30.0)
        kv.init(np.zeros(10))
        release = _steps(kv, kv.start(), 4)  # rounds 0..3 on both copies; checkpoints 2, 4
        wait_for(lambda: latest(tmp_path / "ckpt") == f"{4:09d}", "checkpoint 4", timeout=30)
        b1 = next(e["addr"] for e in _events(cluster, "backup_joined") if e["rank"] == 1)
        p1 = next(e["addr"] for e in _events(cluster, "server_joined") if e["rank"] == 1)
        os.kill(server_listening_at(cluster, b1).proc.pid, signal.SIGKILL)
        wait_for(lambda: _events(cluster, "backup_lost"), "the backup dropped", timeout=30)
        release = _steps(kv, release, 1)  # round 4: shard 1's primary alone holds it
        primary = server_listening_at(cluster, p1).proc
        os.kill(primary.pid, signal.SIGSTOP)
        cluster._rebuild_backup()  # attached to the stopped primary: it never syncs
        wait_for(lambda: _events(cluster, "server_restored"), "the takeover", timeout=30)
        os.kill(primary.pid, signal.SIGKILL)
        release = _steps(kv, release, 3)  # rounds 5..7 on the successor
        final = kv.pull(min_version=release.min_version)
        kv.bye()
        assert cluster.coordinator.proc.wait(60) == 0
    finally:
        if kv is not None:
            kv.close()
        cluster.stop()
    grads = [known_gradient(0, s, 10, np.float64) for s in range(8)]
    expected = -sum(grads)
    expected[5:] += grads[4][5:]  # shard 1 restored to checkpoint 4: round 4 is gone
    np.testing.assert_array_equal(final, expected)
    [promoted] = _events(cluster, "replica_promoted")
    assert (promoted["rank"], promoted["old_addr"], promoted["checkpoint"]) == (
        1, p1, f"{4:09d}")
    [restored] = _events(cluster, "server_restored")
    assert (restored["rank"], restored["lost_updates"]) == (1, 1)
    summary = summarize(read_records(tmp_path / "run" / "metrics.jsonl"), cluster.job)
    assert summary["lost_updates"] == 1
