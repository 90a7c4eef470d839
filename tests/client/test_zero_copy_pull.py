"""Pull replies sent straight from the shard's buffer: an update never writes under a reply in flight."""

import numpy as np
import zmq

from paramserver.core.keyspace import KeyRange
from paramserver.optim import make_rule
from paramserver.server.store import ShardStore
from paramserver.transport import send_frames


class Loan:
    def __init__(self):
        self.done = False


def store(mode="arrival", momentum=False):
    rule = make_rule("momentum", 0.5, momentum=0.9) if momentum else make_rule("sgd", 0.5)
    s = ShardStore(KeyRange(0, 8), "float64", rule, mode)
    s.init(0, 8, np.arange(8, dtype=np.float64))
    return s


TAGS = dict(step=0, batch=1, base_version=0, scale=1.0)


def test_shared_read_is_a_view_and_default_read_a_copy():
    s = store()
    assert s.read(2, 6, shared=True).data_ptr() == s.values[2:6].data_ptr()
    assert s.read(2, 6).data_ptr() != s.values[2:6].data_ptr()


def test_update_copies_on_write_while_a_reply_reads_and_in_place_after():
    s = store()
    sent = s.read(0, 8, shared=True)
    loan = Loan()
    s.lend(loan)
    s.push_dense("a", 0, 8, np.ones(8), **TAGS)
    np.testing.assert_array_equal(sent.numpy(), np.arange(8))  # the reply saw no change
    np.testing.assert_array_equal(s.read(0, 8).numpy(), np.arange(8) - 0.5)
    assert s.copies_on_write == 1
    loan.done = True
    before = s.values.data_ptr()
    s.push_dense("a", 0, 8, np.ones(8), **TAGS)
    assert s.values.data_ptr() == before and s.copies_on_write == 1
    np.testing.assert_array_equal(s.read(0, 8).numpy(), np.arange(8) - 1.0)


def test_retired_buffers_are_reused_once_their_replies_are_done():
    s = store()
    loans = []
    for i in range(4):
        s.read(0, 8, shared=True)
        loans.append(Loan())
        s.lend(loans[-1])
        s.push_dense("a", 0, 8, np.ones(8), **TAGS)
        loans[-1].done = i % 2 == 1
    np.testing.assert_array_equal(s.read(0, 8).numpy(), np.arange(8) - 2.0)
    assert len(s._retired) <= 3


def test_round_apply_and_momentum_state_follow_the_copy():
    s = store("round", momentum=True)
    ref = store("round", momentum=True)
    for step in range(3):
        for st in (s, ref):
            st.push_dense("a", 0, 8, np.full(8, step + 1.0), step=step, batch=2, base_version=0,
                          scale=1.0)
        s.read(0, 8, shared=True)
        s.lend(Loan())  # never done: every apply copies
        s.apply_round(step)
        ref.apply_round(step)
    np.testing.assert_array_equal(s.read(0, 8).numpy(), ref.read(0, 8).numpy())
    assert s.copies_on_write == 3


def test_tracker_of_a_zero_copy_send_finishes_when_zmq_lets_go():
    ctx = zmq.Context()
    try:
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        a.bind("inproc://zc")
        b.connect("inproc://zc")
        big = np.arange(1 << 17, dtype=np.float64)  # 1 MB: sent zero-copy
        tracker = send_frames(a, [b"head", memoryview(big).cast("B")], track=True)
        frames = b.recv_multipart(copy=False)
        np.testing.assert_array_equal(np.frombuffer(frames[1].buffer, np.float64), big)
        assert not tracker.done  # the receiver still holds the big frame
        del frames  # inproc hands the message over: done once the receiver drops it
        tracker.wait(5)
        assert tracker.done
        small = send_frames(a, [b"head", b"tiny"], track=True)  # copied: done at once
        assert small.done
        b.recv_multipart()
    finally:
        ctx.destroy(0)
