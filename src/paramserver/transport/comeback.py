"""Whether a DEALER's connection came back after it dropped: its socket monitor, read when asked.

A peer that dies closes its connection (`DISCONNECTED`); one restarted at the same address
takes the DEALER's reconnect, the ZMTP handshake succeeds again, and whatever that socket had
sent the dead process died with it. A message still queued in the DEALER (sent while no
connection was up) reaches the new peer by itself, so only a drop of a connection that was
up counts: a peer not listening yet (a connect retried) makes no come-back, and a request
sent before it is not sent twice. The client's ShardLinks watches shard DEALERs the same
way; this is the bare watch, for a socket with one request outstanding (a server's
registration).
"""

from __future__ import annotations

import zmq
from zmq.utils import monitor

_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED


class Reconnect:
    """One connection's drop and return, from its monitor's events (pure): `up` is the event
    that says it is up (the handshake, or the TCP connect where the caller watches that)."""

    __slots__ = ("up", "dropped")

    def __init__(self, up: int = zmq.EVENT_HANDSHAKE_SUCCEEDED):
        self.up, self.dropped = up, False

    def seen(self, event: int) -> bool:
        """One monitor event; True when it is the connection back after a drop."""
        if event == zmq.EVENT_DISCONNECTED:
            self.dropped = True
        elif event == self.up and self.dropped:
            self.dropped = False
            return True
        return False


class ComeBack:
    """The monitor of `sock` (poll `monitor` for readability, then ask `came_back`); owns it
    until `close`."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        # Attached after the connect is fine: a connection made before it was up, and only
        # a drop seen here can lead to a come-back.
        self.monitor = sock.get_monitor_socket(_EVENTS)
        self.monitor.linger = 0
        self.reconnect = Reconnect()

    def seen(self, event: int) -> bool:
        """One monitor event; True when it is the connection back after a drop."""
        return self.reconnect.seen(event)

    def came_back(self) -> bool:
        """Whether the connection came back (at least once) since the last call."""
        back = False
        while self.monitor.poll(0):
            back = self.seen(monitor.recv_monitor_message(self.monitor)["event"]) or back
        return back

    def close(self) -> None:
        """The monitor stopped on the socket's side first: a monitor closed beside a live
        socket that still reports to it can stall the context's I/O thread."""
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:  # (the socket closed already: nothing reports any more)
            pass
        self.monitor.close(0)
