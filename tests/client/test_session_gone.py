"""A worker's session after its bye, against a test ROUTER standing for a coordinator restarted
at the same address (real sockets on 127.0.0.1, no job): it is no member any more, so it never
re-registers. It used to answer the new coordinator's `unknown` with a rejoin and be taken back
as a live member: its rank in the policy again with no step to come, a BSP round waiting for
it as long as its process lived."""

from __future__ import annotations

import itertools
import threading
import time

import zmq

from paramserver.client.session import CoordinatorSession
from paramserver.net import rpc
from paramserver.transport import terminate
from paramserver.wire import Message

WAIT_MS = 10_000  # every wait here is bounded by it


def serve(sock, answer: tuple, until) -> list[str]:
    """Answer each request that comes (`answer`: op and fields) until `until(ops)` holds for
    the ops that came, bounded by WAIT_MS; returns them."""
    ops, deadline = [], time.monotonic() + WAIT_MS / 1000
    while not until(ops):
        assert time.monotonic() < deadline, "the session never got there"
        if sock.poll(20):
            ident, msg, _ = rpc.recv(sock, routed=True)
            ops.append(msg.op)
            rpc.send(sock, Message(answer[0], answer[1], rid=msg.rid, src="coord"), ident)
    return ops


def test_a_session_that_said_bye_never_rejoins_a_restarted_coordinator():
    ctx = zmq.Context()
    coord = ctx.socket(zmq.ROUTER)
    coord.linger = 0
    port = coord.bind_to_random_port("tcp://127.0.0.1")
    rids = itertools.count(1)
    session = CoordinatorSession(ctx, f"tcp://127.0.0.1:{port}", "w-test", None,
                                 lambda: next(rids), 5.0, 5.0)
    session.me.rank = 0  # as its welcome made it
    bye = threading.Thread(target=session.bye, args=("done",), daemon=True)
    try:
        session.start_heartbeat(0.05, 30.0)
        ok = ("ok", {})
        serve(coord, ok, lambda ops: ops.count("heartbeat") >= 3)
        bye.start()
        serve(coord, ok, lambda ops: not bye.is_alive())
        # A coordinator restarted at the address: every message is `unknown` to it.
        until = time.monotonic() + 1.0
        ops = serve(coord, ("error", {"msg": "unknown member", "code": "unknown"}),
                    lambda ops: time.monotonic() > until)
        assert "register" not in ops and ops.count("heartbeat") <= 1  # its beats ended
        assert not session.rejoin(session.sock, 0.0)
    finally:
        bye.join(WAIT_MS / 1000)
        session.close()
        coord.close(0)
        terminate(ctx)
