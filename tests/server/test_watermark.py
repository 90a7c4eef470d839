"""Exactly-once for any pipelining depth: each push carries the client's watermark, and a shard
forgets an applied push only once the client says it has the ack."""

import bisect
import os
import random
import signal
import threading

import numpy as np
import pytest

from paramserver.net import rpc
from paramserver.server.dedup import FORGOTTEN, DedupError, DedupTable
from paramserver.wire import Message
from ps_helpers import make_job, running_job, started_client
from paramserver.client.kv import KVWorker


# ---- the table ---------------------------------------------------------------------------------
def test_with_watermarks_no_unacknowledged_push_is_ever_forgotten():
    """Clients pipelining up to 300 pushes deep, acks coming back in any order: every push
    not yet acknowledged is answered from the table, every one below the watermark refused."""
    rng = random.Random(3)
    table = DedupTable(window=4, depth=300)
    for sender in ("a", "b"):
        unacked, pushed, rid = [], [], 0
        for _ in range(3000):
            # As the client counts: pushes from its watermark on, answered or not (`pushed`
            # ascends, so they are its tail from the watermark's place on).
            span = len(pushed) - bisect.bisect_left(pushed, min(unacked, default=rid + 1))
            if span < 300 and rng.random() < 0.55:
                rid += rng.randint(1, 3)  # other requests (pulls, clocks) take ids between
                mark = min(unacked, default=rid)
                assert table.lookup(sender, rid, mark) is None
                table.admit(sender, rid)
                table.remember(sender, rid, {"version": rid}, mark)
                unacked.append(rid)
                pushed.append(rid)
            elif unacked:
                unacked.remove(rng.choice(unacked))  # an ack comes in
            mark = min(unacked, default=rid + 1)
            for old in unacked:  # a retry of any of them: its first ack again
                assert table.lookup(sender, old, mark) == {"version": old}
            if mark > 1:
                assert table.lookup(sender, mark - 1, mark) in (FORGOTTEN, {"version": mark - 1})
        assert len(table) <= 2 * 300


def test_a_push_beyond_the_depth_and_a_sender_beyond_the_table_are_refused_not_forgotten():
    table = DedupTable(depth=3, senders=2)
    for rid in (1, 2, 3):
        table.admit("a", rid)
        table.remember("a", rid, {"version": rid}, mark=1)
    with pytest.raises(DedupError, match="at most 3"):
        table.admit("a", 4)
    assert table.lookup("a", 2, mark=2) == {"version": 2}  # the ack of 1 came: room again
    table.admit("a", 4)
    table.remember("b", 1, {"version": 1}, mark=1)
    with pytest.raises(DedupError, match="new sender must wait"):
        table.admit("c", 1)  # a and b both have pushes they may retry
    table.remember("b", 2, {"version": 2}, mark=3)  # b: all acknowledged but what it sends now
    table.lookup("b", 5, mark=5)  # and now that too
    table.admit("c", 1)
    table.remember("c", 1, {"version": 9}, mark=1)
    assert table.lookup("b", 2) is None and table.lookup("a", 3) == {"version": 3}
    again = DedupTable.load(table.dump(), depth=3, senders=2)
    assert again.dump() == table.dump() and again.lookup("a", 1) is FORGOTTEN


def test_the_client_watermark_is_its_lowest_unanswered_push_per_shard():
    from paramserver.client.core.worker_core import WorkerCore
    from paramserver.core.keyspace import KeyRange
    core = WorkerCore()
    core.welcome(0, [KeyRange(0, 4), KeyRange(4, 8)], 8)
    a = core.request(0, "push a", push=True)
    core.request(0, "pull", push=False)  # pulls are not applied: they hold no watermark
    b = core.request(0, "push b", push=True)
    c = core.request(1, "push c", push=True)
    assert (core.watermark(0), core.watermark(1)) == (a, c)
    core.reply(b, "ack b")  # answered behind an unanswered one: still counted
    assert (core.watermark(0), core.unacked(0)) == (a, 2)
    core.reply(a, "ack a")
    assert (core.watermark(0), core.unacked(0)) == (core.rid + 1, 0)
    core.forget([c])  # given up on: never sent again
    assert core.watermark(1) == core.rid + 1 and core.oldest_push(1) is None


# ---- live: real processes, real sockets ----------------------------------------------------------
def _state(kv, shard=0):
    rid = kv.requests.send(shard, Message("status"))
    return kv.requests.collect([(shard, rid, None)], "status")[rid]["state"]


def _push(src, rid, grad, mark, step=0):
    return Message("push", {"range": [0, grad.size], "step": step, "version": 0, "batch": 1,
                            "wm": mark}, [grad], rid=rid, src=src)


def _ask(sock, msg):
    rpc.send(sock, msg)
    assert sock.poll(10_000), "no reply within 10 s"
    return rpc.recv(sock, routed=False)[1]


def test_a_retry_after_100_newer_pushes_of_an_unacknowledged_push_gets_its_first_ack(tmp_path):
    """A 64-entry window alone forgets rid 1 after 64 newer pushes and refuses the retry, though
    the client never had its ack (a lost ack, a reply dropped by a full queue)."""
    keys = 5
    with started_client(tmp_path, keys) as (cluster, kv):
        sock, src = kv.shards[0].sock, "w-raw"
        grad = np.arange(1.0, keys + 1.0)
        first = _ask(sock, _push(src, 1, grad, mark=1))  # its ack is "lost": mark stays 1
        assert first.op == "ack", first.fields
        for rid in range(2, 102):
            assert _ask(sock, _push(src, rid, grad, mark=1)).op == "ack"
        again = _ask(sock, _push(src, 1, grad, mark=1))
        assert again.op == "ack", again.fields
        assert again.fields == first.fields
        np.testing.assert_array_equal(kv.pull(), -101 * grad)  # sgd, lr 1: each push once
        # The ack is in now (mark 2): a copy of rid 1 from before cannot be proven fresh.
        assert _ask(sock, _push(src, 102, grad, mark=2)).op == "ack"
        late = _ask(sock, _push(src, 1, grad, mark=2))
        assert late.op == "error" and "refused rather than applied twice" in late["msg"]
        np.testing.assert_array_equal(kv.pull(), -102 * grad)
        state = _state(kv)
        assert (state["duplicates"], state["refused_retries"]) == (1, 1)


def test_deep_pipelining_behind_a_frozen_shard_applies_every_push_exactly_once(tmp_path):
    """200 pushes in flight while the shard is frozen, the first retried meanwhile: every push
    is applied once (values equal the reference exactly) and no retry is refused. Fails on
    main, whose window let the first pushes go before their retries came."""
    keys = 16
    with started_client(tmp_path, keys) as (cluster, kv):
        kv.requests.retry_interval = 0.05
        pid = next(c.proc.pid for c in cluster.children if c.role == "server")
        rng = np.random.default_rng(5)
        grads = [rng.integers(-8, 8, keys).astype(np.float64) for _ in range(200)]
        os.kill(pid, signal.SIGSTOP)
        thaw = threading.Timer(0.8, os.kill, (pid, signal.SIGCONT))
        thaw.start()
        try:
            handles = [kv.push_async(g, step=i, batch=1) for i, g in enumerate(grads)]
            for h in handles:  # waiting on the first re-sends it every 50 ms while frozen
                kv.wait(h)
        finally:
            thaw.join()
            os.kill(pid, signal.SIGCONT)
        assert kv.requests.retries >= 3
        np.testing.assert_array_equal(kv.pull(), -np.sum(grads, axis=0))
        state = _state(kv)
        assert state["updates_applied"] == 200 and state["duplicates"] >= 3
        assert state["refused_retries"] == 0 and state["refused_pushes"] == 0


def test_a_client_waits_at_its_unacked_depth_and_the_shard_refuses_one_that_does_not(tmp_path):
    keys = 4
    job = make_job(keys, 1, 1, sync="asp", max_unacked_pushes=8)
    with running_job(tmp_path, job) as cluster:
        kv = KVWorker(cluster.address)
        try:
            kv.init(np.zeros(keys))
            kv.start()
            assert kv.requests.max_unacked == 8
            handles = [kv.push_async(np.ones(keys), step=i, batch=1) for i in range(40)]
            assert max(len(q) for q in kv.core.pushes) <= 8  # it waited for acks
            for h in handles:
                kv.wait(h)
            np.testing.assert_array_equal(kv.pull(), -40 * np.ones(keys))
            # A raw client that ignores the limit: the ninth unacknowledged push is refused.
            sock = kv.shards[0].sock
            for rid in range(1, 9):
                assert _ask(sock, _push("w-raw", rid, np.ones(keys), mark=1)).op == "ack"
            err = _ask(sock, _push("w-raw", 9, np.ones(keys), mark=1))
            assert err.op == "error" and "at most 8" in err["msg"]
            np.testing.assert_array_equal(kv.pull(), -48 * np.ones(keys))
            assert _state(kv)["refused_pushes"] == 1
        finally:
            kv.close()
