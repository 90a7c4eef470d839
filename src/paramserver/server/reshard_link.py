"""Live resharding, a server's I/O (RESHARD_API.md): the protocol is the core's part
server/resharding.py, the rules server/handoff.py's, the coordinator's part
coordinator/reshard.py.

The link carries out what the core decides: it opens a DEALER to each server the core sends
pieces to (SendHandoffs) and closes them (CloseHandoffs), and while the core says the shard
moves it holds workers' requests (bounded: "busy" beyond) until the node handles them again
(ReleaseHeld). It writes none of the core's state.

The handoff DEALERs stay open until the next reshard or the end: a DEALER closed at once
(LINGER 0) would drop pieces not yet delivered, and the coordinator's commit, which waits for
every receiver, says when they were.
"""

from __future__ import annotations

from collections import deque

import zmq

from paramserver.net import rpc
from paramserver.transport import connect_dealer
from paramserver.transport.zmq_sockets import DEFAULT_HWM
from paramserver.wire import Message
from paramserver.wire.protocol import CONTROL_MESSAGE_BYTES

# Workers' requests held while the shard moves (after `reshard`, before the rebuild); the
# fence keeps policy workers quiet then, so these are observers' and bare KV clients'. Their
# replies go out in one burst after the rebuild: no more than a peer's send queue surely
# holds (a ROUTER drops what is over its high-water mark, and the queue's count of what was
# sent on is updated every half of that mark).
MAX_QUEUED = DEFAULT_HWM // 2


class ReshardLink:
    """One server's resharding sockets and held requests. `moves`: its core's Resharding
    (read only: whether the shard moves, under which epoch); `router`: the workers' ROUTER,
    which a "busy" refusal goes out on; `name()`: the name the server sends under now."""

    def __init__(self, ctx: zmq.Context, keys, moves, router: zmq.Socket, name):
        self.ctx, self.keys, self.moves, self.router, self.name = ctx, keys, moves, router, name
        self.queued: deque = deque()  # (ident, msg, frames) of workers, while moving
        self.socks: list[zmq.Socket] = []  # handoff DEALERs of the last reshard
        self.busy = 0  # requests refused "busy" while moving

    def send(self, addr: str, messages: list) -> None:
        """`messages`, each (op, fields, arrays), on a new DEALER to `addr`."""
        # The queue holds every piece (a receiver still binding takes them late): a send
        # never waits.
        sock = connect_dealer(self.ctx, addr, hwm=max(DEFAULT_HWM, len(messages) + 1),
                              send_timeout=0, keys=self.keys, peer="server",
                              max_message=CONTROL_MESSAGE_BYTES)
        self.socks.append(sock)
        src = self.name()
        for op, fields, arrays in messages:
            rpc.send(sock, Message(op, fields, arrays, src=src))

    # ---- workers' requests while moving ---------------------------------------------------------
    def hold(self, ident, msg: Message, frames) -> bool:
        """Queue a worker's request while moving (True); over the bound it is answered
        "busy". False when not moving: handle it now."""
        if not self.moves.moving:
            return False
        if len(self.queued) >= MAX_QUEUED:
            self.busy += 1
            src = self.name()
            rpc.send_or_drop(self.router, Message("error", {
                "msg": f"server {src} is moving keys (reshard {self.moves.epoch}) and holds "
                       f"{MAX_QUEUED} requests already: retry", "code": "busy"},
                rid=msg.rid, src=src), ident)
            return True
        # (frames of a zero-copy receive: kept as they are, the request handled later)
        self.queued.append((ident, msg, frames))
        return True

    def release(self) -> deque:
        """The requests held, in order, for the node to handle now; none held after."""
        queued, self.queued = self.queued, deque()
        return queued

    def close(self) -> None:
        for sock in self.socks:
            sock.close(0)
        self.socks = []
