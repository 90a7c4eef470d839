"""Refusals: the rate-limited log every role uses (pure, a fake clock), the typed parse of the
shared-memory transport's frames, and the lines a live flood leaves in a server's log."""

import json

import numpy as np
import pytest
import zmq

from paramserver.client.kv import KVWorker
from paramserver.core.ratelimit import MAX_LINE, OTHERS, RefusalLog
from paramserver.net import rpc
from paramserver.transport import connect_dealer, shm
from paramserver.transport.shm_frames import (
    HEADER_BYTES, SLOTS, ArenaDesc, Answer, Confirm, Offer, ShmFrameError, parse_refs,
    parse_to_dealer, parse_to_router,
)
from paramserver.wire import Message, WireError, encode
from ps_helpers import make_job, running_job


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_flood_is_logged_as_a_burst_then_one_summary_per_window():
    lines, clock = [], Clock()
    log = RefusalLog(lines.append, clock, burst=3, window=10.0)
    for _ in range(1000):
        log.refused("peer a", "refused a frame from peer a: bad")
        clock.t += 0.005  # 1000 frames in 5 s
    assert len(lines) == 3 and all("peer a" in line for line in lines)
    log.flush()
    assert len(lines) == 3  # the window is still open
    clock.t = 10.0
    log.flush()
    assert lines[3] == "refused 997 more frames from peer a in the last 10 s"
    log.flush()
    assert len(lines) == 4  # said once
    log.refused("peer a", "again")  # a new window starts with a fresh burst
    assert len(lines) == 5 and log.total == 1001


def test_windows_are_per_source_and_ever_new_sources_share_one():
    lines, clock = [], Clock()
    log = RefusalLog(lines.append, clock, burst=1, window=1.0, max_sources=2)
    for i in range(100):
        log.refused(f"peer {i}", f"refused a frame from peer {i}")
    assert len(lines) == 3  # peer 0, peer 1, then the rest as one source
    assert set(log.windows) == {"peer 0", "peer 1", OTHERS}
    clock.t = 1.0
    log.flush()
    assert lines[-1] == f"refused 97 more frames from {OTHERS} in the last 1 s"
    assert not log.windows


def test_a_window_with_nothing_held_back_ends_silently():
    lines, clock = [], Clock()
    log = RefusalLog(lines.append, clock, burst=5, window=1.0)
    log.refused("p", "refused a frame from p: bad")
    clock.t = 5.0
    log.flush()
    assert lines == ["refused a frame from p: bad"] and not log.windows


def test_lines_quoting_a_sender_are_cut():
    lines = []
    RefusalLog(lines.append, Clock()).refused("p", "version " + "x" * 60_000)
    assert len(lines[0]) <= MAX_LINE and lines[0].endswith("...")


def test_refusal_log_settings_are_checked():
    with pytest.raises(ValueError):
        RefusalLog(print, Clock(), burst=0)


DESC = {"host": "h", "pid": 10, "fd": 3, "size": 1 << 20}


def test_handshake_frames_parse_into_typed_values():
    assert parse_to_router(json.dumps({"arena": DESC, "slot": 2}).encode()) == \
        Offer(ArenaDesc("h", 10, 3, 1 << 20), 2)
    assert parse_to_router(b'{"confirm": true}') == Confirm(True)
    assert parse_to_dealer(json.dumps({"attached": True, "arena": DESC}).encode()) == \
        Answer(True, ArenaDesc("h", 10, 3, 1 << 20))
    assert parse_to_dealer(b'{"attached": false}') == Answer(False, None)
    refs = parse_refs(json.dumps({"seq": 4, "refs": [[1, HEADER_BYTES, 8]]}).encode(), 2)
    assert refs.seq == 4 and refs.refs == ((1, HEADER_BYTES, 8),)


@pytest.mark.parametrize("body, fault", [
    (b'{"arena": {"host": "h", "pid": Infinity, "fd": 3, "size": 1}, "slot": 0}', "Infinity"),
    (b'{"arena": {"host": "h", "pid": NaN, "fd": 3, "size": 1}, "slot": 0}', "NaN"),
    (json.dumps({"arena": {**DESC, "size": 1 << 70}, "slot": 0}).encode(), "'size'"),
    (json.dumps({"arena": {**DESC, "size": 1.0e6}, "slot": 0}).encode(), "'size'"),
    (json.dumps({"arena": {**DESC, "pid": -1}, "slot": 0}).encode(), "'pid'"),
    (json.dumps({"arena": {**DESC, "fd": "../x"}, "slot": 0}).encode(), "'fd'"),
    (json.dumps({"arena": {k: v for k, v in DESC.items() if k != "pid"}, "slot": 0}).encode(),
     "'pid'"),
    (json.dumps({"arena": {**DESC, "host": 5}, "slot": 0}).encode(), "'host'"),
    (json.dumps({"arena": DESC, "slot": SLOTS}).encode(), "'slot'"),
    (json.dumps({"arena": DESC, "slot": True}).encode(), "'slot'"),
    (json.dumps({"arena": DESC}).encode(), "'slot'"),
    (b'{"confirm": 1}', "'confirm'"),
    (b"[1, 2]", "not a map"),
    (b"[" * 3000 + b"]" * 3000, "exceeds"),
    (b"[" * 2000 + b"]" * 2000, "RecursionError"),
    (b"\xff", "not valid JSON"),
])
def test_hostile_hellos_raise_a_clear_error(body, fault):
    with pytest.raises(ShmFrameError, match=fault.replace("[", r"\[")):
        parse_to_router(body)


@pytest.mark.parametrize("head", [
    {"seq": 1, "refs": [[1, 2 ** 60, 2 ** 60]]}, {"seq": 1, "refs": [[2, HEADER_BYTES, 8]]},
    {"seq": 1, "refs": [[0, 0, 8]]}, {"seq": 1, "refs": [[0, HEADER_BYTES, -1]]},
    {"seq": 1, "refs": [[0, HEADER_BYTES]]}, {"seq": 1, "refs": [[0.0, HEADER_BYTES, 8]]},
    {"seq": -1, "refs": [[0, HEADER_BYTES, 8]]}, {"seq": 1, "refs": []}, {"seq": 1},
])
def test_hostile_descriptors_raise_a_clear_error(head):
    with pytest.raises(ShmFrameError):
        parse_refs(json.dumps(head).encode(), 2)


def test_a_dealer_given_a_hostile_answer_gets_a_refusal_not_an_exception():
    """The worker's side of the handshake: a ROUTER (a server, or whatever listens at its
    address) answering the offer with insane numbers."""
    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer = connect_dealer(ctx, f"tcp://127.0.0.1:{port}")
        shm.offer_shared(dealer, shm.Arena(1 << 16), 0)
        assert router.poll(5000)
        ident, _, _ = router.recv_multipart()
        answer = json.dumps({"attached": True, "arena": {**DESC, "pid": float("inf")}}).encode()
        router.send_multipart([ident, shm.HELLO, answer])
        router.send_multipart([ident, shm.REFS + b'{"seq": 1e999}', b""])
        router.send_multipart([ident, *encode(Message("ok", rid=7))])
        got = []
        for _ in range(3):
            assert dealer.poll(5000)
            got.append(rpc.recv(dealer, routed=False)[1])
        assert all(isinstance(g, WireError) for g in got[:2]), got
        assert "shared-memory frame refused: Infinity" in str(got[0])
        assert got[2].op == "ok" and got[2].rid == 7
    finally:
        ctx.destroy(linger=0)


def test_a_flood_of_bad_frames_leaves_a_few_log_lines_and_refused_ops_are_logged(tmp_path):
    with running_job(tmp_path, make_job(8, 1, 1, sync="asp")) as cluster:
        kv = KVWorker(cluster.address)
        kv.init(np.arange(8, dtype=np.float64))
        ctx = zmq.Context()
        try:
            rogue = connect_dealer(ctx, kv.shards[0].addr)
            rogue.send_multipart(encode(Message("shutdown", rid=1, src="mallory")))
            for _ in range(2000):
                rogue.send_multipart([b"\xc1 garbage"])
            replies = 0  # (answers beyond the queues' high-water marks are dropped)
            while rogue.poll(2000):
                rogue.recv_multipart()
                replies += 1
            assert replies >= 64
        finally:
            ctx.destroy(linger=0)
        np.testing.assert_array_equal(kv.pull(), np.arange(8))
        kv.close()
        text = (cluster.run_dir / "logs" / "server-0.log").read_text()
        assert "refused shutdown from 'mallory'" in text
        assert text.count("not valid msgpack") <= 10, text[-2000:]
