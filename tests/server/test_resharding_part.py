"""Live resharding's part of the shard core (server/resharding.py), driven by events alone: no
sockets, no clock. The pieces one core sends go through the wire codec and the node's parser to
the core they are for, as a server's link and node would carry them."""

import numpy as np
import pytest

from paramserver.server.core import ShardCore
from paramserver.server.events import (
    CloseHandoffs, HandoffPiece, Init, JoinMove, Log, Pull, Push, ReleaseHeld, Reply,
    ReshardAbort, ReshardCommit, ReshardStart, SendHandoffs, ShardSettings, ToCoordinator,
)
from paramserver.server.node import PIECE_EVENTS
from paramserver.server.resharding import MAX_EARLY
from paramserver.wire import Message, decode, encode

N = 20
OLD = [[0, "a", 0, 10], [1, "b", 10, N]]
NEW = [[0, "a", 0, 4], [1, "b", 4, N]]


def settings(rank, lo, hi):
    return ShardSettings(rank=rank, lo=lo, hi=hi, dtype="float32", apply_mode="arrival",
                         optimizer="momentum", lr=0.1, optimizer_options={"momentum": 0.9},
                         max_message_bytes=64, chunk_bytes=64)  # pieces of a few keys


def trained(rank, lo, hi, pushes=1):
    """A shard of OLD with values lo..hi-1 and `pushes` pushes of ones applied (momentum)."""
    c = ShardCore(settings(rank, lo, hi))
    c.handle(Init("i", lo, hi, np.arange(lo, hi, dtype=np.float32)))
    for rid in range(1, pushes + 1):
        assert c.handle(Push("t", "w", rid, lo, hi, np.ones(hi - lo, np.float32), rid, 1,
                             0))[-1].op == "ack"
    return c


def pushed_once(lo, hi):
    """Keys [lo, hi) of OLD's shard 0 as `trained` leaves them (one push, momentum's first step)."""
    return trained(0, 0, 10).store.values.numpy()[lo:hi]


def pieces(out, src):
    """The pieces of `out`'s SendHandoffs, through the wire and the node's parser, by the
    address they go to."""
    to = {}
    for ins in out:
        if type(ins) is SendHandoffs:
            for op, fields, arrays in ins.messages:
                msg = decode(encode(Message(op, fields, arrays, src=src)))
                to.setdefault(ins.addr, []).append(PIECE_EVENTS[op](msg, ins.addr))
    return to


def of(kind, out):
    return [i for i in out if type(i) is kind]


def logs(out, level="warning"):
    return [i.text for i in out if type(i) is Log and i.level == level]


def test_a_move_sends_its_keys_keeps_the_rest_and_serves_the_new_range_at_the_commit():
    a, b = trained(0, 0, 10), trained(1, 10, N)
    want = np.concatenate([a.store.values.numpy(), b.store.values.numpy()])
    momentum = np.concatenate([a.store.state["momentum"].numpy(),
                               b.store.state["momentum"].numpy()])
    out_a = a.handle(ReshardStart(1, OLD, NEW, 3, "a"))
    assert type(out_a[0]) is CloseHandoffs  # the last reshard's sockets go first
    sent = pieces(out_a, "s0")
    assert list(sent) == ["b"] and len(sent["b"]) > 1  # keys [4, 10) in several pieces
    (done_a,) = of(ToCoordinator, out_a)  # a keeps [0, 4): whole at once
    assert done_a.op == "resharded" and done_a.fields == {"epoch": 1, "rank": 0, "version": 3}
    assert a.resharding.moving and b.handle(Pull("p", 0.0, 0, 10, 12))[0].op == "values"
    out_b = b.handle(ReshardStart(1, OLD, NEW, 3, "b"))
    assert of(SendHandoffs, out_b) == [] and of(ToCoordinator, out_b) == []
    assert b.resharding.waiting(2) == {
        "op": "handoff", "peer": "servers",
        "note": "reshard 1: 1 run(s) of keys still to come (first [4, 10]), 2 request(s) held"}
    reports = [i for p in sent["b"] for i in b.handle(p) if type(i) is ToCoordinator]
    assert [r.fields for r in reports] == [{"epoch": 1, "rank": 1, "version": 3}]
    assert b.resharding.waiting(0)["op"] == "reshard_commit"
    # Whole, b serves its old range until the commit's word.
    assert (b.store.range.lo, b.store.range.hi) == (10, N)
    for core, (rank, _, lo, hi) in ((a, NEW[0]), (b, NEW[1])):
        out = core.handle(ReshardCommit(1))
        assert type(out[-1]) is ReleaseHeld
        assert (core.settings.rank, core.store.range.lo, core.store.range.hi) == (rank, lo, hi)
        assert core.epoch == 1 and core.layout == NEW and core.store.version == 3
        assert not core.resharding.moving and core.resharding.waiting(0) is None
        np.testing.assert_array_equal(core.store.values.numpy(), want[lo:hi])
        np.testing.assert_array_equal(core.store.state["momentum"].numpy(), momentum[lo:hi])
    assert a.handle(Pull("p", 0.0, 0, 4, 5))[0].fields["code"] == "moved"


def test_pieces_before_their_reshard_wait_for_it_and_a_bad_one_is_refused_alone():
    a, b = trained(0, 0, 10), trained(1, 10, N)
    sent = pieces(a.handle(ReshardStart(1, OLD, NEW, 0, "a")), "s0")["b"]
    # A malformed piece of the same reshard, early too: its header says more keys than it has.
    fields = dict(sent[0].fields, hi=sent[0].fields["hi"] + 1)
    bad = HandoffPiece(1, "s9", False, fields, sent[0].arrays)
    for piece in (bad, *sent):
        assert b.handle(piece) == ()  # b has not heard of reshard 1: kept
    assert not b.resharding.moving
    out = b.handle(ReshardStart(1, OLD, NEW, 0, "b"))
    (refused,) = logs(out)
    assert "an early handoff from s9 refused" in refused
    (done,) = of(ToCoordinator, out)  # whole from the early pieces alone
    assert done.fields["rank"] == 1 and b.resharding.early == []
    b.handle(ReshardCommit(1))
    np.testing.assert_array_equal(b.store.values.numpy()[:6], pushed_once(4, 10))


def test_too_many_early_pieces_are_refused():
    b = trained(1, 10, N)
    piece = pieces(trained(0, 0, 10).handle(ReshardStart(1, OLD, NEW, 0, "a")), "s0")["b"][0]
    for _ in range(MAX_EARLY):
        assert b.handle(piece) == ()
    with pytest.raises(ValueError, match="wait for a reshard not heard of"):
        b.handle(piece)
    assert len(b.resharding.early) == MAX_EARLY


def test_a_reshard_is_given_up_for_a_newer_one_and_the_old_ones_pieces_are_dropped():
    a, b = trained(0, 0, 10), trained(1, 10, N)
    first = pieces(a.handle(ReshardStart(1, OLD, NEW, 0, "a")), "s0")["b"]
    b.handle(ReshardStart(1, OLD, NEW, 0, "b"))
    b.handle(first[0])
    # A server of move 1 was replaced: the coordinator starts it again as move 2.
    out = b.handle(ReshardStart(2, OLD, NEW, 0, "b"))
    assert "reshard 1 given up for reshard 2" in logs(out)[0]
    assert of(CloseHandoffs, out) and b.resharding.epoch == 2 and b.resharding.moving
    assert b.resharding.waiting(0)["note"].startswith("reshard 2: 1 run(s) of keys still to "
                                                      "come (first [4, 10])")
    (dropped,) = logs(b.handle(first[1]))
    assert "for epoch 1 dropped (at 2)" in dropped
    # a's old core was untouched by move 1: the same move from it as move 2 goes through.
    a2 = trained(0, 0, 10)
    second = pieces(a2.handle(ReshardStart(2, OLD, NEW, 0, "a")), "s0")["b"]
    reports = [i for p in second for i in b.handle(p) if type(i) is ToCoordinator]
    assert [r.fields["epoch"] for r in reports] == [2]
    assert logs(b.handle(ReshardCommit(1)))  # the move given up: its commit changes nothing
    assert b.resharding.moving
    b.handle(ReshardCommit(2))
    assert (b.store.range.lo, b.epoch) == (4, 2)
    np.testing.assert_array_equal(b.store.values.numpy()[:6], pushed_once(4, 10))
    # An older reshard heard late is ignored, the shard as it is.
    (ignored,) = logs(b.handle(ReshardStart(1, OLD, NEW, 0, "b")))
    assert "reshard 1 ignored (at epoch 2)" in ignored and b.store.range.lo == 4


def test_commit_and_abort_of_another_epoch_or_before_the_report_are_ignored():
    a = trained(0, 0, 10)
    assert "not moving" in logs(a.handle(ReshardCommit(1)))[0]
    assert "abort of reshard 1 ignored" in logs(a.handle(ReshardAbort(1)))[0]
    b = trained(1, 10, N, pushes=2)
    b.handle(ReshardStart(1, OLD, NEW, 0, "b"))
    # Not whole yet: no commit can be meant for it.
    assert "commit of reshard 1 ignored (at 1)" in logs(b.handle(ReshardCommit(1)))[0]
    assert "abort of reshard 2 ignored (at 1)" in logs(b.handle(ReshardAbort(2)))[0]
    assert b.resharding.moving
    out = b.handle(ReshardAbort(1))
    assert "reshard 1 given up: serving keys [10, 20) as before" in logs(out)[0]
    assert of(CloseHandoffs, out) and type(out[-1]) is ReleaseHeld
    assert not b.resharding.moving and b.epoch == 0
    assert (b.store.range.lo, b.store.range.hi, b.store.version) == (10, N, 2)
    assert logs(b.handle(ReshardCommit(1)))  # after the abort: nothing to commit


def test_a_drained_server_reports_once_its_pieces_are_out_and_holds_nothing_after_its_commit():
    a, b = trained(0, 0, 10, pushes=2), trained(1, 10, N)
    moved = a.store.values.numpy().copy()
    alone = [[0, "b", 0, N]]
    out = a.handle(ReshardStart(1, OLD, alone, 0, "a"))
    sent = pieces(out, "s0")["b"]
    (report,) = of(ToCoordinator, out)
    assert report.fields == {"epoch": 1, "rank": 0, "version": 2, "drained": True}
    assert a.resharding.moving and not a.resharding.drained
    assert a.resharding.waiting(0)["op"] == "reshard_commit"
    b.handle(ReshardStart(1, OLD, alone, 0, "b"))
    assert [i for p in sent for i in b.handle(p) if type(i) is ToCoordinator]
    out = a.handle(ReshardCommit(1))
    assert type(out[-1]) is ReleaseHeld and a.resharding.drained
    assert a.store.range.size == 0 and a.epoch == 1 and a.layout == alone
    assert a.handle(Pull("p", 0.0, 0, 0, 1))[0].fields["code"] == "moved"
    # A retry of a push applied before the move is still answered, not moved.
    (ack,) = a.handle(Push("t", "w", 2, 0, 10, np.ones(10, np.float32), 2, 1, 0))
    assert ack.op == "ack"
    b.handle(ReshardCommit(1))
    np.testing.assert_array_equal(b.store.values.numpy()[:10], moved)


def test_a_joiner_that_finishes_before_its_reshard_learns_the_layout_from_it():
    a = trained(0, 0, 10)
    joined = [[0, "a", 0, 6], [1, "c", 6, 10], [2, "b", 10, N]]
    c = ShardCore(settings(1, 6, 10))
    out = c.handle(JoinMove(1, "c"))
    assert "joins at epoch 1: waiting for keys [6, 10)" in logs(out, "info")[0]
    assert c.resharding.moving
    sent = pieces(a.handle(ReshardStart(1, OLD, joined, 0, "a")), "s0")
    assert list(sent) == ["c"]
    reports = [i for p in sent["c"] for i in c.handle(p) if type(i) is ToCoordinator]
    assert [r.fields["rank"] for r in reports] == [1]
    c.handle(ReshardCommit(1))
    assert c.layout is None and c.epoch == 1  # its reshard not heard yet
    assert c.handle(ReshardStart(1, OLD, joined, 5, "c")) == []
    assert c.layout == joined and c.store.version == 5
    np.testing.assert_array_equal(c.store.values.numpy(), pushed_once(6, 10))


def test_a_joiner_given_up_joins_the_newer_move_from_scratch():
    c = ShardCore(settings(1, 6, 10))
    c.handle(JoinMove(1, "c"))
    joined = [[0, "a", 0, 6], [1, "c", 6, 10], [2, "b", 10, N]]
    out = c.handle(ReshardStart(2, OLD, joined, 0, "c"))
    assert "reshard 1 given up for reshard 2" in logs(out)[0]
    assert any("joins at epoch 2" in t for t in logs(out, "info"))
    assert c.resharding.moving and c.resharding.epoch == 2 and c.resharding.layout == joined
    a = trained(0, 0, 10)
    sent = pieces(a.handle(ReshardStart(2, OLD, joined, 0, "a")), "s0")["c"]
    assert [i.fields["epoch"] for p in sent for i in c.handle(p) if type(i) is ToCoordinator] \
        == [2]
    c.handle(ReshardCommit(2))
    assert c.layout == joined and (c.store.range.lo, c.store.range.hi) == (6, 10)


def test_a_reshard_that_does_not_name_the_server_is_refused():
    a = trained(0, 0, 10)
    with pytest.raises(ValueError, match="not in the old layout"):
        a.handle(ReshardStart(1, OLD, [[0, "z", 0, 10], [1, "b", 10, N]], 0, "z"))
    assert not a.resharding.moving


def test_a_waiting_pull_is_answered_by_the_rebuilt_shard():
    a, b = trained(0, 0, 10), trained(1, 10, N)
    sent = pieces(a.handle(ReshardStart(1, OLD, NEW, 4, "a")), "s0")["b"]
    assert b.handle(Pull(("p", 1), 0.0, 4, 12, 14)) == ()  # waits for version 4
    b.handle(ReshardStart(1, OLD, NEW, 4, "b"))
    for p in sent:
        b.handle(p)
    out = b.handle(ReshardCommit(1))
    (reply,) = of(Reply, out)
    assert reply.to == ("p", 1) and reply.op == "values" and reply.fields["version"] == 4
    assert out.index(reply) < out.index(of(ReleaseHeld, out)[0])
