"""Hostile transport frames against live roles: the shared-memory handshake (any process on the
host can compute the host token it checks) with insane numbers, wrong types, missing fields and
garbage; by-reference descriptors pointing anywhere. No frame may end a role: each is answered
(an error, or a declined handshake) or dropped, and the role goes on serving."""

import json

import numpy as np
import pytest
import zmq

from paramserver.client.kv import KVWorker
from paramserver.transport import connect_dealer, shm
from paramserver.transport.shm_arena import _host_token
from paramserver.wire import decode
from ps_helpers import make_job, running_job

INF, NAN = float("inf"), float("nan")
BIG = 1 << 70


def _desc(**over):
    desc = {"host": _host_token(), "pid": 1, "fd": 0, "size": 1 << 20}
    desc.update(over)
    return {k: v for k, v in desc.items() if v is not ...}


# Offers a DEALER may make to a ROUTER; json.dumps writes inf/nan as Infinity/NaN.
HOSTILE_OFFERS = [
    {"arena": _desc(pid=INF), "slot": 0},
    {"arena": _desc(pid=NAN), "slot": 0},
    {"arena": _desc(fd=INF), "slot": 0},
    {"arena": _desc(size=INF), "slot": 0},
    {"arena": _desc(size=BIG), "slot": 0},
    {"arena": _desc(size=-1), "slot": 0},
    {"arena": _desc(pid=-5), "slot": 0},
    {"arena": _desc(pid="1"), "slot": 0},
    {"arena": _desc(pid=[1]), "slot": 0},
    {"arena": _desc(pid=...), "slot": 0},
    {"arena": _desc(size=...), "slot": 0},
    {"arena": _desc(fd="../../etc/passwd"), "slot": 0},
    {"arena": _desc(pid="self/../1"), "slot": 0},
    {"arena": _desc(host=7), "slot": 0},
    {"arena": [1, 2], "slot": 0},
    {"arena": _desc(), "slot": INF},
    {"arena": _desc(), "slot": True},
    {"arena": _desc(), "slot": -1},
    {"confirm": INF},
    {"attached": INF, "arena": _desc(pid=INF)},
    [1, 2, 3],
    "hello",
    None,
]
HOSTILE_BODIES = [json.dumps(o).encode() for o in HOSTILE_OFFERS] + [
    b"[" * 100_000 + b"]" * 100_000,  # nesting beyond the parser's recursion limit
    b"{\"arena\": " * 5000,
    b"\xff\xfe garbage",
    b"",
    b"Infinity",
]


def _hostile_refs(arena: shm.Arena) -> list[list]:
    """By-reference descriptors (after a real offer was accepted) pointing anywhere."""
    heads = [{"seq": INF, "refs": []}, {"seq": 1, "refs": [[1, INF, 8]]},
             {"seq": 1, "refs": [[1, 4096, BIG]]}, {"seq": 1, "refs": [[1, -4096, 8]]},
             {"seq": 1, "refs": [[NAN, 4096, 8]]}, {"seq": 1, "refs": [[1, 4096]]},
             {"seq": 1, "refs": "x"}, {"seq": 1}, {"refs": []}, [1], {"seq": 1, "refs": [None]}]
    out = []
    for head in heads:
        out.append([shm.REFS + json.dumps(head).encode(), b""])
    out.append([shm.REFS + b"[" * 100_000, b""])
    return out


def _attack(ctx, addr: str) -> int:
    """Every hostile handshake and descriptor to the ROUTER at `addr`; then a garbage protocol
    frame, whose error reply shows the role still serves. Returns the replies seen."""
    replies = 0
    for body in HOSTILE_BODIES:
        rogue = connect_dealer(ctx, addr)
        rogue.send_multipart([shm.HELLO, body])
        rogue.send_multipart([b"\xc1"])  # not msgpack: answered with an error
        while rogue.poll(5000):
            frames = rogue.recv_multipart()
            replies += 1
            if frames[0] != shm.HELLO:
                assert decode(frames).op == "error"
                break
        else:
            raise AssertionError(f"no answer from {addr} after the handshake {body[:60]!r}")
        rogue.close(0)
    # An offer of a real arena (mapped by the peer), then descriptors pointing anywhere.
    arena = shm.Arena(1 << 16)
    for frames in _hostile_refs(arena):
        rogue = connect_dealer(ctx, addr)
        rogue.send_multipart([shm.HELLO, json.dumps({"arena": arena.describe(),
                                                     "slot": 0}).encode()])
        rogue.send_multipart(frames)
        rogue.send_multipart([b"\xc1"])
        got_error = False
        while not got_error and rogue.poll(5000):
            frames = rogue.recv_multipart()
            replies += 1
            got_error = frames[0] != shm.HELLO and decode(frames).op == "error"
        assert got_error, f"no error reply from {addr} after {frames[0][:60]!r}"
        rogue.close(0)
    return replies


@pytest.mark.parametrize("target", ["server", "coordinator"])
def test_hostile_handshakes_never_stop_a_role(tmp_path, target):
    with running_job(tmp_path, make_job(8, 1, 1, sync="asp")) as cluster:
        kv = KVWorker(cluster.address)
        kv.init(np.arange(8, dtype=np.float64))
        kv.start()
        ctx = zmq.Context()
        try:
            addr = kv.shards[0].addr if target == "server" else cluster.address
            assert _attack(ctx, addr) >= len(HOSTILE_BODIES)
        finally:
            ctx.destroy(linger=0)
        for child in cluster.children:
            assert child.proc.poll() is None, f"{child.name} died:\n{child.tail()}"
        kv.push(np.ones(8), step=0, batch=1)
        np.testing.assert_array_equal(kv.pull(), np.arange(8) - 1.0)
        assert kv.clock(0, 1, 0.0).step == 1
        kv.bye()
        kv.close()
