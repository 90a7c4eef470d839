"""A SIGKILLed server: restarted from the latest checkpoint with exactly the rounds since lost,
or, with recovery off, the job stops naming it instead of hanging."""

import contextlib
import os
import signal
import threading

import numpy as np
import pytest

from paramserver.core.exits import Exit
from paramserver.runlog.metrics import read_records, summarize
from paramserver.runlog.checkpoint import latest
from paramserver.launch.local import LaunchError, LocalCluster
from paramserver.client.kv import KVWorker
from ps_helpers import known_gradient, make_job, shard_process, supervised, wait_for

KEYS = 10  # two shards: [0, 5) and [5, 10)


def _job(tmp_path, **extra):
    return make_job(KEYS, 2, 1, sync="bsp", lr=1.0, retry_interval=0.3,
                    checkpoint={"dir": str(tmp_path / "ckpt"), "every": 2}, **extra)


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
            wait_for(lambda: latest(tmp_path / "ckpt") == f"{4:09d}", "checkpoint 4", timeout=30.0)
            os.kill(shard_process(cluster, 1).proc.pid, signal.SIGKILL)  # round 4 lost on shard 1
            release = _steps(kv, release, 5)  # retried until the restarted server answers
            final = kv.pull(min_version=release.min_version)
            # No assertion on the client's resend count: ZeroMQ may hand a request queued
            # for the dead peer to the restarted one, and then none is needed. The final
            # values and the restart record below are what recovery must get right.
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


def test_what_a_dead_server_had_taken_goes_to_its_restarted_process_at_once(tmp_path):
    """The requests the killed process had taken died with it: they are sent again as soon as
    the restarted server's connection is up, not after the retry interval, which here is
    longer than the worker waits for any reply (so waiting it out fails the steps)."""
    job = _job(tmp_path)
    job["retry_interval"] = 600.0
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=120, restart_servers=1)
    with _recovering_job(cluster) as kv:
        kv.timeout = 20.0
        kv.init(np.zeros(KEYS))
        release = _steps(kv, kv.start(), 5)
        wait_for(lambda: latest(tmp_path / "ckpt") == f"{4:09d}", "checkpoint 4", timeout=30.0)
        os.kill(shard_process(cluster, 1).proc.pid, signal.SIGKILL)  # round 4 lost on shard 1
        release = _steps(kv, release, 5)
        final = kv.pull(min_version=release.min_version)
        kv.bye()
    grads = [known_gradient(0, s, KEYS, np.float64) for s in range(10)]
    expected = -sum(grads)
    expected[5:] += grads[4][5:]
    np.testing.assert_array_equal(final, expected)
    assert cluster.server_restarts == 1


def test_without_recovery_a_dead_server_stops_the_job_naming_it(tmp_path):
    job = _job(tmp_path, server_timeout=1.0)
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=120)
    try:
        cluster.start(spawn_workers=False)
        kv = KVWorker(cluster.address, keys=cluster.client_keys("worker"))
        try:
            kv.init(np.zeros(KEYS))
            release = _steps(kv, kv.start(), 2)
            victim = shard_process(cluster, 1)
            os.kill(victim.proc.pid, signal.SIGKILL)
            # The worker gives up on the dead server, naming it: by its request's timeout, or
            # first (a loaded machine) by its link to the server down for as long.
            kv.timeout = 2.0
            with pytest.raises(TimeoutError, match=r"server 1 at tcp://[\d.:]+ (did not answer"
                                                   r"|has been unreachable)"):
                kv.push(np.ones(KEYS), step=release.step, batch=1)
        finally:
            kv.close()
        coord = cluster.children[0]
        coord.proc.wait(30)
        assert coord.proc.returncode == Exit.PEER_LOST and "server s1" in coord.tail()
        with pytest.raises(LaunchError, match="server .* died .*--restart-servers"):
            cluster.wait()
    finally:
        cluster.stop()


@contextlib.contextmanager
def _recovering_job(cluster):
    """Starts `cluster` (no workers of its own), watches it with cluster.wait in a thread and
    yields a worker of this process; on the way out the worker is closed, the job must have
    ended cleanly within 60 s, and the cluster is stopped."""
    try:
        cluster.start(spawn_workers=False)
        supervisor, errors = supervised(cluster)
        kv = KVWorker(cluster.address, keys=cluster.client_keys("worker"))
        kv.timeout = 30.0
        try:
            yield kv
        finally:
            kv.close()
        supervisor.join(60)
        assert not supervisor.is_alive() and not errors
    finally:
        cluster.stop()


@pytest.mark.slow  # fast twin: test_resume's corrupt-checkpoint fallback, and the restart above
def test_a_restarted_server_whose_checkpoint_is_truncated_falls_back_to_the_previous_one(
        tmp_path):
    cluster = LocalCluster(_job(tmp_path), tmp_path / "run", job_timeout=120, restart_servers=1)
    with _recovering_job(cluster) as kv:
        kv.init(np.zeros(KEYS))
        release = _steps(kv, kv.start(), 5)  # rounds 0..4 applied; checkpoints at 2 and 4
        wait_for(lambda: latest(tmp_path / "ckpt") == f"{4:09d}", "checkpoint 4", timeout=30.0)
        path = tmp_path / "ckpt" / f"ckpt-{4:09d}" / "server-1" / "values.npy"
        path.write_bytes(path.read_bytes()[:-8])
        victim = shard_process(cluster, 1)
        os.kill(victim.proc.pid, signal.SIGKILL)
        release = _steps(kv, release, 5)
        final = kv.pull(min_version=release.min_version)
        kv.bye()
    grads = [known_gradient(0, s, KEYS, np.float64) for s in range(10)]
    expected = -sum(grads)
    for lost in (2, 3, 4):  # shard 1 restored to checkpoint 2: rounds 2..4 are gone there
        expected[5:] += grads[lost][5:]
    np.testing.assert_array_equal(final, expected)
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [(r["server"], r["checkpoint"], r["lost_updates"]) for r in records
            if r["kind"] == "restart"] == [(1, f"{2:09d}", 3)]
    log = victim.log_path.read_text()  # (the restarted server writes to the same log)
    assert (f"checkpoint {4:09d} is unusable (" in log and "values.npy is truncated" in log
            and f"falling back to the previous kept checkpoint {2:09d}" in log)


# "after the start" in the slow set (the default suite is at its budget): the restore from
# checkpoint 0 stays default here before the start (the harder case: checkpoint 0 not yet
# committed), and a restart after the start in
# test_killed_server_restarts_from_the_checkpoint_and_loses_exactly_the_rounds_since.
@pytest.mark.parametrize("when", ["before the start",
                                  pytest.param("after the start", marks=pytest.mark.slow)])
def test_a_server_killed_before_the_first_checkpoint_comes_back_from_its_initial_values(
        tmp_path, when):
    """Checkpoint 0 is the initial values: each shard saves it when its init comes, so a
    server lost before any scheduled checkpoint (even before the coordinator committed
    checkpoint 0) is restored from it and the job goes on."""
    job = _job(tmp_path)
    job["checkpoint"]["every"] = 1000
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=120, restart_servers=1)
    with _recovering_job(cluster) as kv:
        init = np.arange(KEYS, dtype=np.float64) * 10
        kv.init(init)
        if when == "before the start":
            os.kill(shard_process(cluster, 1).proc.pid, signal.SIGKILL)
            release = kv.start()
        else:
            release = kv.start()
            os.kill(shard_process(cluster, 1).proc.pid, signal.SIGKILL)
        release = _steps(kv, release, 4)
        final = kv.pull(min_version=release.min_version)
        kv.bye()
    # Nothing was applied before the death: nothing is lost.
    expected = init - sum(known_gradient(0, s, KEYS, np.float64) for s in range(4))
    np.testing.assert_array_equal(final, expected)
    assert cluster.server_restarts == 1
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [(r["server"], r["checkpoint"], r["lost_updates"]) for r in records
            if r["kind"] == "restart"] == [(1, f"{0:09d}", 0)]


def test_a_restarted_server_with_no_usable_checkpoint_ends_the_job_at_once_naming_why(tmp_path):
    """Not the coordinator's restart_timeout (120 s) later with 'did not come back': the
    server exits as soon as it has looked, and the launcher names what it found."""
    # Plaintext: this test is about the checkpoint, not about how a keyed process exits.
    cluster = LocalCluster(_job(tmp_path), tmp_path / "run", job_timeout=120, restart_servers=1,
                           keys=None)
    try:
        cluster.start(spawn_workers=False)
        supervisor, errors = supervised(cluster)
        kv = KVWorker(cluster.address)
        kv.timeout = 5.0
        try:
            kv.init(np.zeros(KEYS))
            _steps(kv, kv.start(), 5)
            wait_for(lambda: latest(tmp_path / "ckpt") == f"{4:09d}", "checkpoint 4", timeout=30.0)
            for tag in (2, 4):
                path = tmp_path / "ckpt" / f"ckpt-{tag:09d}" / "server-1" / "values.npy"
                path.write_bytes(path.read_bytes()[:-8])
            os.kill(shard_process(cluster, 1).proc.pid, signal.SIGKILL)
            supervisor.join(60)  # well within the coordinator's restart_timeout
            assert not supervisor.is_alive()
        finally:
            kv.close()
    finally:
        cluster.stop()
    (error,) = errors
    assert isinstance(error, LaunchError)
    assert "no usable checkpoint of shard 1" in str(error) and "truncated" in str(error)
