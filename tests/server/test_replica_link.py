"""A replicated shard's link (server/replica_link.py) on real sockets, in one process: the
primary's forwards reach a backup on this host through the primary's shared arena, and the
backup holds its own copy of what it acknowledged (the primary writes that memory again once
the ack is in, and may die at any time), and posts its acks where the primary reads them
without a message. The slow live checks are tests/server/test_replicas_live.py.
"""

import time

import numpy as np
import pytest

from paramserver.net import rpc
from paramserver.server.core import ShardCore
from paramserver.server.events import ShardSettings, Then
from paramserver.server.node import EVENTS
from paramserver.server.replica_link import ReplicaLink
from paramserver.transport import bind_router, new_context, shm, terminate
from paramserver.wire import Message
from paramserver.wire.codec import decode, encode

KEYS = 40_000  # 160 KB of float32: above shm.MIN_BYTES, so it may go by reference


def _core():
    return ShardCore(ShardSettings(rank=0, lo=0, hi=KEYS, dtype="float32",
                                   apply_mode="arrival", optimizer="sgd", lr=1.0))


def _run(core, instructions):
    """As a node carries out its core's instructions: a Then is handled next, the rest (the
    replies) go nowhere here."""
    for ins in instructions:
        if type(ins) is Then:
            _run(core, core.handle(ins.event))


class Pair:
    """A primary's link and a backup's link joined by real sockets; `pump` moves what is
    queued either way (as each node's loop would) until `until()` holds (bounded)."""

    def __init__(self, ctx):
        self.notes, self.pushes, self.inits = [], [], []
        self.primary_core, self.backup_core = _core(), _core()
        self.primary = ReplicaLink(ctx, None, False, 5.0, self.primary_core, self._run_p,
                                   lambda op, f: self.notes.append(op))
        self.backup = ReplicaLink(ctx, None, True, 5.0, self.backup_core, self._run_b,
                                  lambda op, f: self.notes.append(op))
        self.router, self.addr = bind_router(ctx)
        events = dict(EVENTS)
        events["push"] = self._seen_push
        events["init"] = self._seen_init
        self.events = events

    def _seen_push(self, msg, to):
        event = EVENTS["push"](msg, to)
        self.pushes.append(event.grad)  # what the backup's core applies (and keeps no longer)
        return event

    def _seen_init(self, msg, to):
        event = EVENTS["init"](msg, to)
        self.inits.append(event.values)
        return event

    def _run_p(self, instructions):
        _run(self.primary_core, instructions)

    def _run_b(self, instructions):
        _run(self.backup_core, instructions)

    def pump(self, until, what: str, timeout: float = 10.0, primary: bool = True):
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout} s")
            if self.router.poll(10):
                ident, msg, frames = rpc.recv(self.router, True)
                if msg is not None:
                    self.received = frames
                    self.backup.take(self.router, ident, msg, self.events, frames)
            if primary and self.primary.sock is not None and self.primary.sock.poll(0):
                self.primary.from_backup()

    def close(self):
        self.primary.close()
        self.router.close(0)


@pytest.fixture
def pair():
    ctx = new_context()
    p = Pair(ctx)
    try:
        yield p
    finally:
        p.close()
        terminate(ctx)


def _request(op: str, rid: int, grad: np.ndarray) -> tuple[Message, list]:
    """A worker's request as the primary has it: decoded, and its frames as received."""
    fields = {"range": [0, KEYS]}
    if op == "push":
        fields.update(step=rid, batch=1, version=0)
    frames = [bytes(f) for f in encode(Message(op, fields, [grad], rid=rid, src="w0"))]
    return decode(frames), frames


def _forward(pair, op: str, rid: int, grad: np.ndarray) -> None:
    """What the primary's node does with a write: forward, apply; then wait for the ack."""
    msg, frames = _request(op, rid, grad)
    seq = pair.primary.forward(msg, frames[0])
    _run(pair.primary_core, pair.primary_core.handle(EVENTS[op](msg, ("w0", rid))))
    pair.pump(lambda: pair.primary.forwarder.acked_seq >= seq, f"ack of forward {seq}")


def _attach(pair) -> None:
    pair.primary.from_coordinator(Message("attach_backup", {"rank": 0, "addr": pair.addr,
                                                            "epoch": 1}))
    pair.pump(lambda: "backup_synced" in pair.notes, "synced backup")
    _forward(pair, "init", 1, np.zeros(KEYS, np.float32))


def test_a_forward_goes_through_the_arena_and_the_backup_is_done_with_it_at_the_ack(pair):
    """A dense push is applied from the primary's arena, then acknowledged (no copy); any
    other forward's arrays are copied out first, as a core may keep them. Either way, once
    the ack is in, the primary may write the region again (its next forward, or garbage as
    it dies) and the backup's values do not change."""
    _attach(pair)
    pair.pump(lambda: shm.shared_with(pair.primary.sock), "shared-memory handshake")
    pair.primary.shared_bytes = 0
    grad = np.arange(KEYS, dtype=np.float32)
    _forward(pair, "push", 2, grad)
    assert pair.primary.shared_bytes == grad.nbytes  # it went by reference ...
    assert any(type(f) is shm.SharedFrame for f in pair.received)
    again = np.full(KEYS, 7.0, np.float32)
    _forward(pair, "init", 3, again)  # (ignored once initialized; its array still copied)
    assert pair.primary.shared_bytes == grad.nbytes + again.nbytes
    pair.primary._ring_bytes[:] = 0xFF  # ... and the primary writes those regions again
    assert not np.array_equal(pair.pushes[-1], grad)  # the push was read in place
    np.testing.assert_array_equal(pair.inits[-1], again)  # the init's array is its own
    np.testing.assert_array_equal(pair.backup_core.store.values.numpy(), -grad)
    np.testing.assert_array_equal(pair.primary_core.store.values.numpy(), -grad)


def test_without_shared_memory_forwards_go_over_the_socket(pair, monkeypatch):
    monkeypatch.setenv("PARAMSERVER_SHM", "0")
    _attach(pair)
    grad = np.ones(KEYS, dtype=np.float32)
    _forward(pair, "push", 2, grad)
    assert pair.primary.arena is None and pair.primary.shared_bytes == 0
    assert not any(type(f) is shm.SharedFrame for f in pair.received)
    np.testing.assert_array_equal(pair.backup_core.store.values.numpy(), -grad)


def test_the_primary_takes_the_ack_the_backup_posted_in_its_arena_before_the_message(pair):
    shm.serve_shared(pair.router, shm.Arena(1 << 16))  # the backup's arena (its values' there)
    _attach(pair)
    pair.pump(lambda: shm.shared_with(pair.primary.sock)
              and shm.peer_counter(pair.primary.sock, 0) is not None, "both arenas mapped")
    msg, frames = _request("push", 2, np.ones(KEYS, np.float32))
    seq = pair.primary.forward(msg, frames[0])
    assert pair.primary.hold(seq, ["ack to w0"]) == []  # the backup has not taken it yet
    # The backup takes it (its fwd_ack message stays unread on the primary's socket) ...
    pair.pump(lambda: pair.backup_core.store.version == 1, "the backup's apply", primary=False)
    released = []
    pair.primary.execute = released.extend
    pair.primary.tick(time.monotonic())  # ... and the primary's next look releases the reply
    assert released == ["ack to w0"] and pair.primary.forwarder.acked_seq == seq
    assert pair.primary.sock.poll(5000)
    pair.primary.from_backup()  # the fwd_ack message
    assert released == ["ack to w0"]  # the message came after: nothing twice


def test_values_are_held_until_the_backup_has_every_write_in_them(pair):
    """A pull answered while a forward is unacknowledged would show a write only the primary
    holds: a primary deposed meanwhile (stopped past its backup's promotion, then continued)
    served such a write, which no surviving copy ever held. The reply waits for the ack, as a
    copy taken when it was made; without an ack it never goes."""
    from paramserver.server.events import Pull, Reply
    sent = []
    pair.primary.execute = lambda ins: (sent.extend(i for i in ins if type(i) is Reply),
                                        pair._run_p(ins))
    _attach(pair)

    def pull(rid):
        (reply,) = pair.primary_core.handle(Pull(("w1", rid), 0.0, 0, 0, KEYS))
        return reply
    assert not pair.primary.hold_read(pull(10))  # nothing pending: it goes at once
    msg, frames = _request("push", 11, np.ones(KEYS, np.float32))
    seq = pair.primary.forward(msg, frames[0])
    _run(pair.primary_core, pair.primary_core.handle(EVENTS["push"](msg, ("w0", 11))))
    reply = pull(12)
    assert reply.arrays[0][0] == -1.0  # the primary's values already hold the write ...
    assert pair.primary.hold_read(reply)  # ... so they wait
    pair.primary_core.store.values[:] = 7.0  # later writes do not show through the held copy
    assert sent == [] and pair.primary.held_read_bytes == KEYS * 4
    assert not pair.primary.full
    pair.pump(lambda: pair.primary.forwarder.acked_seq >= seq, f"ack of forward {seq}")
    assert pair.primary.held_read_bytes == 0
    (released,) = [r for r in sent if r.to == ("w1", 12)]
    assert released.committed and not released.lend
    np.testing.assert_array_equal(released.arrays[0], -np.ones(KEYS, np.float32))
    np.testing.assert_array_equal(pair.backup_core.store.values.numpy(), released.arrays[0])
    # A forward the backup never acknowledges (it was promoted): the values never go.
    msg, frames = _request("push", 13, np.ones(KEYS, np.float32))
    pair.primary.forward(msg, frames[0])
    assert pair.primary.hold_read(pull(14))
    time.sleep(0.3)
    pair.primary.shared_ack()
    assert not [r for r in sent if r.to == ("w1", 14)]
    # Held copies are bounded: past the cap the primary reads no more requests (a full
    # window's back-pressure), rather than copying the shard once per pull.
    from paramserver.server import replica_link
    rid = 15
    while not pair.primary.full:
        assert pair.primary.hold_read(pull(rid))
        rid += 1
    cap = max(replica_link.HELD_READ_BYTES,
              replica_link.HELD_READ_SHARDS * KEYS * 4)
    assert cap <= pair.primary.held_read_bytes < cap + KEYS * 4
