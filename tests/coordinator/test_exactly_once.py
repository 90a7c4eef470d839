"""Exactly-once pushes: the bounded dedup table against a reference, and live retried pushes."""

import os
import random
import signal
import threading
import numpy as np
import pytest

from paramserver.net import rpc
from paramserver.server.dedup import FORGOTTEN, DedupTable
from paramserver.wire import Message
from ps_helpers import started_client


class ReferenceTable:
    """What the table must remember: per sender its last `window` rids and the highest rid it
    let go of, the `senders` most recently heard senders; written plainly with lists."""

    def __init__(self, window, senders):
        self.window, self.senders = window, senders
        self.order: list[str] = []  # least recently heard first
        self.rids: dict[str, list] = {}
        self.replies: dict[tuple, dict] = {}
        self.floor: dict[str, int] = {}

    def remember(self, sender, rid, reply):
        if sender in self.order:
            self.order.remove(sender)
        self.order.append(sender)
        if len(self.order) > self.senders:
            gone = self.order.pop(0)
            del self.rids[gone]
            self.floor.pop(gone, None)
        rids = self.rids.setdefault(sender, [])
        rids.append(rid)  # the test's rids only grow, as a client's do
        self.replies[(sender, rid)] = reply
        for old in rids[:-self.window]:
            self.floor[sender] = max(self.floor.get(sender, -1), old)
        del rids[:-self.window]

    def lookup(self, sender, rid):
        if rid in self.rids.get(sender, []):
            return self.replies[(sender, rid)]
        floor = self.floor.get(sender)
        return FORGOTTEN if floor is not None and rid <= floor else None


def test_dedup_table_answers_like_the_reference_and_stays_bounded():
    rng = random.Random(7)
    table, ref = DedupTable(window=5, senders=3), ReferenceTable(5, 3)
    next_rid = {f"w{i}": 0 for i in range(5)}
    for _ in range(3000):
        sender = rng.choice(list(next_rid))
        if rng.random() < 0.6:
            next_rid[sender] += rng.randint(1, 3)
            reply = {"version": rng.randint(0, 99), "staleness": rng.randint(0, 3)}
            table.remember(sender, next_rid[sender], reply)
            ref.remember(sender, next_rid[sender], reply)
        rid = next_rid[sender] - rng.randint(0, 8)
        assert table.lookup(sender, rid) == ref.lookup(sender, rid)
        assert len(table) <= 5 * 3
    assert DedupTable.load(table.dump(), 5, 3).dump() == table.dump()


def test_dedup_table_forgets_the_oldest_request_and_sender():
    table = DedupTable(window=2, senders=2)
    for rid in (1, 2, 3):
        table.remember("a", rid, {"version": rid})
    # rid 1 fell out of the window: it may have been applied, so it is not "never applied".
    assert table.lookup("a", 1) is FORGOTTEN and table.lookup("a", 3) == {"version": 3}
    assert table.lookup("a", 5) is None  # above the window: fresh
    table.remember("b", 1, {"version": 10})
    table.remember("a", 4, {"version": 4})  # a is now the most recently heard
    table.remember("c", 1, {"version": 20})  # so b falls out
    assert table.lookup("b", 1) is None
    assert table.lookup("a", 4) == {"version": 4} and table.lookup("c", 1) == {"version": 20}
    with pytest.raises(ValueError):
        DedupTable(window=0)


def test_a_dump_keeps_what_the_window_let_go_and_an_old_dump_still_reads():
    table = DedupTable(window=2)
    for rid in (1, 2, 3, 4):
        table.remember("a", rid, {"version": rid})
    again = DedupTable.load(table.dump(), 2)
    assert again.lookup("a", 2) is FORGOTTEN and again.lookup("a", 4) == {"version": 4}
    old = DedupTable.load([["a", [[3, {"version": 3}], [4, {"version": 4}]]]], 2)
    assert old.lookup("a", 4) == {"version": 4} and old.lookup("a", 9) is None


def test_a_retry_older_than_the_window_is_refused_and_counted_never_applied():
    """The hole: a retry that comes after more than a window of newer pushes from its sender
    was applied a second time. Now the shard refuses it loudly and counts it."""
    from paramserver.server.core import ShardCore
    from paramserver.server.events import Init, Push, ShardSettings, Status
    n = 4
    c = ShardCore(ShardSettings(rank=0, lo=0, hi=n, dtype="float64", apply_mode="arrival",
                                optimizer="sgd", lr=1.0))
    c.handle(Init("i", 0, n, np.zeros(n)))

    def push(rid):
        return c.handle(Push("w", "a", rid, 0, n, np.ones(n), 0, 1, 0))

    window = c.retries.table.window
    for rid in range(1, window + 3):  # rid 1 and 2 fall out of the window
        assert push(rid)[-1].op == "ack"
    before = c.store.values.numpy().copy()
    out = push(1)
    assert [r.op for r in out] == ["error"] and "refused rather than applied twice" in \
        out[0].fields["msg"]
    np.testing.assert_array_equal(c.store.values.numpy(), before)
    assert push(window + 2)[-1].op == "ack" and c.retries.duplicates == 1  # in the window: answered
    np.testing.assert_array_equal(c.store.values.numpy(), before)
    state = c.handle(Status("s"))[0].fields["state"]
    assert state["refused_retries"] == 1 and state["updates_applied"] == window + 2


def _server_pid(cluster):
    return next(c.proc.pid for c in cluster.children if c.role == "server")


def test_the_same_push_frame_twice_is_applied_once(tmp_path):
    keys = 6
    with started_client(tmp_path, keys) as (cluster, kv):
        grad = np.arange(1.0, keys + 1.0)
        msg = Message("push", {"range": [0, keys], "step": 0, "version": 0, "batch": 1},
                      [grad], rid=77, src=kv.src)
        sock = kv.shards[0].sock
        replies = []
        for _ in range(2):
            rpc.send(sock, msg)
            assert sock.poll(10_000), "no ack within 10 s"
            replies.append(rpc.recv(sock, routed=False)[1])
        assert [r.op for r in replies] == ["ack", "ack"]
        assert replies[0].fields == replies[1].fields  # the original ack, repeated
        np.testing.assert_array_equal(kv.pull(), -grad)  # sgd, lr 1: one step, not two
        # Another request id is another push: applied.
        kv.push(grad, step=1, batch=1)
        np.testing.assert_array_equal(kv.pull(), -2 * grad)


def test_a_push_retried_while_its_server_is_frozen_is_applied_once(tmp_path):
    keys = 8
    with started_client(tmp_path, keys) as (cluster, kv):
        kv.requests.retry_interval = 0.05
        pid = _server_pid(cluster)
        os.kill(pid, signal.SIGSTOP)  # every copy of the push queues up behind the freeze
        thaw = threading.Timer(0.6, os.kill, (pid, signal.SIGCONT))
        thaw.start()
        try:
            kv.push(np.ones(keys), step=0, batch=1)  # retried every 50 ms meanwhile
        finally:
            thaw.join()
        assert kv.requests.retries >= 3
        np.testing.assert_array_equal(kv.pull(), -np.ones(keys))
        rid = kv.requests.send(0, Message("status"))
        state = kv.requests.collect([(0, rid, None)], "status")[rid]["state"]
        assert state["updates_applied"] == 1 and state["duplicates"] >= 3
