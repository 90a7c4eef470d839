"""A server's registration against a test ROUTER standing for the coordinator (threads of this
process, real sockets on 127.0.0.1): a joiner waiting for its welcome registers again, under a
new rid, when the coordinator's connection comes back (a coordinator restarted at its address
after it died during the joiner's fence); a coordinator not listening yet gets the one
registration, not two. The whole story against real processes: tests/server/test_reshard_live.py.
"""

from __future__ import annotations

import threading
import time

import zmq

from paramserver.net import rpc
from paramserver.server.node import ServerNode
from paramserver.transport import connect_dealer, terminate
from paramserver.transport.comeback import ComeBack
from paramserver.wire import Message
from paramserver.wire.protocol import CONTROL_MESSAGE_BYTES
from ps_helpers import free_port

WAIT_MS = 10_000  # every wait of these tests is bounded by it


def router(ctx, addr: str) -> zmq.Socket:
    """A ROUTER bound at `addr`; a port a closed one held comes free within a moment (ZeroMQ
    closes sockets in its I/O thread), so its bind is tried again, bounded."""
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        try:
            sock.bind(addr)
            return sock
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                sock.close(0)
                raise
            time.sleep(0.01)


def registration(sock: zmq.Socket) -> tuple[bytes, Message]:
    assert sock.poll(WAIT_MS), "no registration came"
    ident, msg, _ = rpc.recv(sock, routed=True)
    assert msg.op == "register" and msg["role"] == "server"
    return ident, msg


class Registering:
    """ServerNode._register run in a thread on a DEALER to `addr`; `result` its welcome or
    the exception it raised."""

    def __init__(self, ctx, addr: str, timeout: float = 8.0):  # (ends within WAIT_MS)
        self.node = ServerNode(addr, register_timeout=timeout)
        self.node.coord = connect_dealer(ctx, addr, send_timeout=0,
                                         max_message=CONTROL_MESSAGE_BYTES)
        self.result = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.result = self.node._register("tcp://127.0.0.1:1")
        except Exception as exc:  # noqa: BLE001 (the test reads it)
            self.result = exc

    def end(self) -> None:
        self.thread.join(WAIT_MS / 1000)
        assert not self.thread.is_alive()
        self.node.coord.close(0)


def welcome(sock, ident, rid) -> None:
    rpc.send(sock, Message("welcome", {"rank": 2, "job": {}}, rid=rid, src="coord"), ident)


def test_a_registration_goes_again_when_the_coordinator_comes_back_at_its_address():
    ctx = zmq.Context()
    addr = f"tcp://127.0.0.1:{free_port()}"
    first = router(ctx, addr)
    joiner = None
    try:
        joiner = Registering(ctx, addr)
        _, msg = registration(first)
        assert msg.rid == 0
        first.close(0)  # the coordinator dies during the joiner's fence...
        second = router(ctx, addr)  # ...and is restarted at its address
        try:
            ident, again = registration(second)
            assert again.rid == 1 and again["addr"] == "tcp://127.0.0.1:1"
            assert not second.poll(300)  # once: the first died with the old process
            welcome(second, ident, again.rid)
            joiner.end()
            assert isinstance(joiner.result, Message) and joiner.result["rank"] == 2
            # A late answer to a registration is no refusal of a later re-registration.
            joiner.node._from_coordinator(Message("error", {"msg": "late", "code": "refused"},
                                                  rid=1, src="coord"))
        finally:
            second.close(0)
    finally:
        first.close(0)
        if joiner is not None:
            joiner.end()
        terminate(ctx)


def test_a_coordinator_not_listening_yet_gets_the_registration_once():
    ctx = zmq.Context()
    addr = f"tcp://127.0.0.1:{free_port()}"
    joiner = Registering(ctx, addr)
    sock = None
    try:
        assert not joiner.thread.join(0.5)  # its connects retried meanwhile
        sock = router(ctx, addr)
        ident, msg = registration(sock)
        assert msg.rid == 0 and not sock.poll(300)
        welcome(sock, ident, msg.rid)
        joiner.end()
        assert isinstance(joiner.result, Message)
    finally:
        if sock is not None:
            sock.close(0)
        joiner.end()
        terminate(ctx)


def test_a_refusal_ends_the_registration():
    ctx = zmq.Context()
    addr = f"tcp://127.0.0.1:{free_port()}"
    sock = router(ctx, addr)
    joiner = Registering(ctx, addr)
    try:
        ident, msg = registration(sock)
        rpc.send(sock, Message("error", {"msg": "no", "code": "refused"}, rid=msg.rid,
                               src="coord"), ident)
        joiner.end()
        assert type(joiner.result).__name__ == "Refused"
    finally:
        sock.close(0)
        joiner.end()
        terminate(ctx)


def test_the_watch_sees_a_come_back_only_after_a_drop():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    watch = ComeBack(sock)
    try:
        assert [watch.seen(e) for e in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED,
                                        zmq.EVENT_CONNECT_RETRIED,
                                        zmq.EVENT_HANDSHAKE_SUCCEEDED,
                                        zmq.EVENT_HANDSHAKE_SUCCEEDED)] == [
            False, False, False, True, False]
    finally:
        watch.close()
        sock.close(0)
        terminate(ctx)
