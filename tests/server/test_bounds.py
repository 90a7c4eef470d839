"""Bounds on what one peer can make a shard server hold: the largest frame, waiting pulls per
client, a big frame's memory after it is gone, the arenas of clients that left. Real
processes and sockets; the server is measured from outside (psutil, /proc)."""

import os
import signal
import time

import numpy as np
import psutil
import pytest
import zmq

from paramserver.client.kv import KVWorker
from paramserver.net import rpc
from paramserver.spec.job import JobSpec, JobSpecError, Limits
from paramserver.wire import Message
from ps_helpers import CTX, make_job, running_job

MB = 1 << 20


def _server(cluster) -> psutil.Process:
    return psutil.Process(next(c.proc.pid for c in cluster.children if c.role == "server"))


def _rss_mb(proc) -> float:
    return proc.memory_info().rss / MB


def _dealer(ctx, addr):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(addr)
    return sock


def _status(kv) -> dict:
    rid = kv.requests.send(0, Message("status"))
    return kv.requests.collect([(0, rid, None)], "status")[rid]["state"]


def _settled_rss(proc, seconds=3.0) -> float:
    """The RSS once the server had `seconds` to take what was sent (and to tidy)."""
    time.sleep(seconds)
    return _rss_mb(proc)


# ---- the limit in the job ------------------------------------------------------------------------
def test_the_message_limit_is_derived_from_the_model_unless_given():
    small = JobSpec(num_keys=1000)
    assert small.message_limit() == 16 * MB + 2 * MB + MB  # chunk_bytes + 1/8 + 1 MB
    big = JobSpec(num_keys=10 ** 8)  # a keys frame naming every key: 800 MB
    assert big.message_limit() == 8 * 10 ** 8 + 10 ** 8 + MB
    assert big.message_limit(keys=1000) == small.message_limit()  # one small shard's part
    given = JobSpec(num_keys=10 ** 8, limits=Limits(max_message_bytes=4 * MB))
    assert given.message_limit() == 4 * MB
    assert JobSpec.from_dict(given.to_dict()) == given
    with pytest.raises(JobSpecError, match="max_message_bytes"):
        Limits(max_message_bytes=100)
    with pytest.raises(JobSpecError, match="max_pending_pulls"):
        Limits(max_pending_pulls=0)


def _push_big(ctx, kv, keys: int, mb: int):
    """A raw push of `mb` MB of values for `keys` keys to the worker's shard 0, from a socket of
    its own (returned), as a client that ignores the limit would send it. Zero pages: sending
    them costs this process nothing."""
    sock = _dealer(ctx, kv.shards[0].addr)
    big = np.zeros(mb * MB // 8)
    rpc.send(sock, Message("push", {"range": [0, keys], "step": 0, "version": 0, "batch": 1},
                           [big], rid=1, src="big"))
    return sock


# ---- a big frame -----------------------------------------------------------------------------
def test_a_frame_above_the_limit_is_never_held_and_the_server_keeps_serving(tmp_path):
    """Without a limit, a 256 MB frame would be read whole and its memory kept."""
    keys = 64
    with running_job(tmp_path, make_job(keys, 1, 1)) as cluster:  # limit derived: ~19 MB
        kv = KVWorker(cluster.address, shared_memory=False)
        ctx = zmq.Context()
        try:
            kv.init(np.zeros(keys))
            proc = _server(cluster)
            before = _settled_rss(proc, 1.0)
            sock = _push_big(ctx, kv, keys, 256)
            after = _settled_rss(proc)
            assert after - before < 64, (before, after)
            assert _status(kv)["initialized"]  # still serving
            # The client refuses to send what the shard would drop, naming the limit.
            with pytest.raises(ValueError, match="max_message_bytes"):
                kv.push_sparse(np.zeros(3 * MB, np.int64), np.zeros(3 * MB), step=0, batch=1)
            kv.push(np.ones(keys), step=0, batch=1)
            np.testing.assert_array_equal(kv.pull(), -np.ones(keys))
        finally:
            ctx.destroy(0)
            kv.close()


def test_a_big_frame_under_the_limit_leaves_no_peak_behind(tmp_path):
    keys = 64
    job = make_job(keys, 1, 1, max_message_bytes=300 * MB)
    with running_job(tmp_path, job) as cluster:
        kv = KVWorker(cluster.address, shared_memory=False)
        ctx = zmq.Context()
        try:
            kv.init(np.zeros(keys))
            proc = _server(cluster)
            before = _settled_rss(proc, 1.0)
            sock = _push_big(ctx, kv, keys, 200)
            assert sock.poll(30_000), "no answer to the big push"
            reply = rpc.recv(sock, routed=False)[1]
            assert reply.op == "error"  # 200 MB of values for 64 keys: read, then refused
            # The peak is behind us (the frame was read): wait, as long as before, for the
            # memory to go back, no longer than it takes.
            deadline = time.monotonic() + 3.0
            while _rss_mb(proc) - before >= 64 and time.monotonic() < deadline:
                time.sleep(0.05)
            after = _rss_mb(proc)
            assert after - before < 64, (before, after)
        finally:
            ctx.destroy(0)
            kv.close()


# ---- waiting pulls -------------------------------------------------------------------------------
def test_a_pull_flood_is_capped_per_client_with_a_clear_error_and_others_still_served(tmp_path):
    """Without a cap, all 1,500 pulls of the one client would wait, none refused."""
    keys, flood = 16, 1500
    with running_job(tmp_path, make_job(keys, 1, 1)) as cluster:
        kv = KVWorker(cluster.address, shared_memory=False)
        ctx = zmq.Context()
        try:
            kv.init(np.zeros(keys))
            kv.start()
            sock = _dealer(ctx, kv.shards[0].addr)
            for rid in range(1, flood + 1):
                rpc.send(sock, Message("pull", {"range": [0, keys], "min_version": 10 ** 9},
                                       rid=rid, src="flood"))
            errors = []
            deadline = time.monotonic() + 60
            while len(errors) < flood - 1024 and time.monotonic() < deadline:
                if sock.poll(1000):
                    errors.append(rpc.recv(sock, routed=False)[1])
            assert len(errors) == flood - 1024  # the default max_pending_pulls
            assert all(e.op == "error" and "at most 1024 may" in e["msg"] for e in errors)
            state = _status(kv)
            assert (state["pending_pulls"], state["refused_pulls"]) == (1024, flood - 1024)
            # Another client's pull ahead waits as ever and is answered by the push.
            ahead = kv.pull_async(min_version=1)
            kv.push(np.ones(keys), step=0, batch=1)
            np.testing.assert_array_equal(kv.wait(ahead), -np.ones(keys))
        finally:
            ctx.destroy(0)
            kv.close()


# ---- arenas of clients that left ---------------------------------------------------------------
def _arenas(proc) -> int:
    """Distinct shared-memory arenas mapped by `proc` (its own among them)."""
    inodes = set()
    with open(f"/proc/{proc.pid}/maps") as f:
        for line in f:
            if "paramserver-arena" in line:
                inodes.add(line.split()[4])
    return len(inodes)


def _visit(addr: str, keys: int, ready=None) -> None:
    """A client that maps the shard's arena and offers its own, pushes from it, pulls, and
    leaves (or, with `ready`, says so and waits there to be killed)."""
    kv = KVWorker(addr, role="observer", heartbeat=False)
    grad = kv.shared_buffer()
    grad[:] = 1.0
    kv.push(grad, step=0, batch=1)
    kv.pull()
    if ready is not None:
        ready.set()
        time.sleep(120)
    kv.close()


def test_the_arenas_of_clients_that_left_or_died_are_unmapped(tmp_path):
    """Without unmapping, every departed client's arena would stay mapped in the server."""
    keys = 1 << 16
    with running_job(tmp_path, make_job(keys, 1, 1)) as cluster:
        kv = KVWorker(cluster.address, shared_memory=False)
        try:
            kv.init(np.zeros(keys))
            proc = _server(cluster)
            alone = _arenas(proc)
            # In this process: the arena's file is closed on close(), the mapping stays ours.
            _visit(cluster.address, keys)
            for i in range(4):  # in processes: two leave, two are killed holding everything
                ready = CTX.Event() if i % 2 else None
                p = CTX.Process(target=_visit, args=(cluster.address, keys, ready))
                p.start()
                if ready is not None:
                    assert ready.wait(60), "the client did not push and pull within 60 s"
                    os.kill(p.pid, signal.SIGKILL)
                p.join(60)
                assert p.exitcode is not None
            deadline = time.monotonic() + 10
            while _arenas(proc) > alone and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _arenas(proc) == alone
            assert _status(kv)["updates_applied"] >= 1  # and it still serves
        finally:
            kv.close()


def test_a_max_message_bytes_below_a_shard_cuts_every_request_to_fit(tmp_path):
    """--max-message-bytes at its least (128 KB), a shard of 1 MB: the init, the pushes and
    the pulls go in chunks that pass the shard's bound with CURVE's wrapping (a chunk of
    exactly the bound was dropped by ZeroMQ, and the worker waited for its ack forever)."""
    import subprocess
    import sys
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "train", "--workers", "2", "--steps", "6",
         "--servers", "2", "--max-message-bytes", "131072", "--eval-interval", "0",
         "--quiet", "--out", str(tmp_path / "run")], capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "12 steps" in proc.stdout
