"""ShardLinks over real sockets: a shard DEALER's connection that dropped and came back (its
server restarted at the same address) is named once, so its unanswered requests go again; a
connection that was never up (the server not listening yet) coming up is not."""

import socket
import time
from types import SimpleNamespace

import zmq

from paramserver.client.links import ShardLinks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _poll_came_back(links: ShardLinks, want: list[int], timeout: float = 10.0) -> list[int]:
    """came_back() until it names something (or `timeout` s pass): what it named."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        links.check()
        got = links.came_back()
        if got or not want:
            return got
        time.sleep(0.02)
    return []


def test_a_connection_back_after_a_drop_is_named_once_and_a_first_connect_is_not():
    ctx = zmq.Context()
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RECONNECT_IVL, 20)
    links = None
    routers = []
    try:
        dealer.connect(addr)  # nothing listens yet: its connects are retried
        links = ShardLinks([SimpleNamespace(sock=dealer, rank=0, addr=addr)], limit=60.0)
        time.sleep(0.2)
        router = ctx.socket(zmq.ROUTER)
        routers.append(router)
        router.bind(addr)
        dealer.send(b"hello")  # through the first connection
        assert router.poll(5000) and router.recv_multipart()[1] == b"hello"
        time.sleep(0.2)
        assert _poll_came_back(links, [], 0.5) == []  # the first connect: nothing to send again
        router.close(0)  # the server dies...
        time.sleep(0.3)
        router = ctx.socket(zmq.ROUTER)
        routers.append(router)
        router.bind(addr)  # ...and comes back at its address
        assert _poll_came_back(links, [0]) == [0]
        assert links.came_back() == []  # named once
    finally:
        if links is not None:
            links.close()
        for r in routers:
            r.close(0)
        dealer.close(0)
        ctx.term()
