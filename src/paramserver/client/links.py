"""Whether a client's shard servers are still there: its DEALERs' connection events, watched.

A server that dies (or is killed) closes its connections, and its port then refuses the
DEALER's reconnects; a worker waiting for its replies would otherwise wait out the whole request
`timeout` (minutes) for a process that no longer exists. A server unreachable for longer than
the job allows (a heartbeat timeout, or the restart timeout when dead servers are restarted at
the same address) is judged gone, and the wait fails naming it.

A server that comes back at the same address (`--restart-servers`) takes the DEALER's
reconnect: the requests its dead process had taken died with it, and waiting out the retry
interval for them would stall every worker that long, so the shards whose connection came back
are handed to the caller, which sends their unanswered requests again at once.
"""

from __future__ import annotations

import time

import zmq
from zmq.utils import monitor

from paramserver.transport.comeback import Reconnect

_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
_DOWN = (zmq.EVENT_DISCONNECTED, zmq.EVENT_CONNECT_RETRIED)


class ShardLinks:
    """One monitor per shard DEALER, read when asked; owns and closes those monitors."""

    def __init__(self, shards: list, limit: float):
        self.shards, self.limit = shards, limit
        # Up until told otherwise: the monitor may start after the connection was made (and
        # a server that never answers is refused: its reconnects are retried, and say so).
        self.down_since: list[float | None] = [None] * len(shards)
        self.monitors = []
        # Called before each check: follows a shard whose backup took over (replicas), or a
        # new shard map (live resharding).
        self.follow = None
        # Addresses a newer shard map no longer names (a drained server, which shuts down
        # after the switch): not judged gone while this client has not switched yet.
        self.leaving: frozenset[str] = frozenset()
        # Each shard's drop and return (a connect retried before the server listened is no
        # drop: what was sent then is still queued, and reaches it), and the shards whose
        # connection came back after a drop, not yet taken (`came_back`).
        self.reconnects = [Reconnect(zmq.EVENT_CONNECTED) for _ in shards]
        self.back: set[int] = set()
        try:
            for s in shards:
                m = s.sock.get_monitor_socket(_EVENTS)
                m.linger = 0
                self.monitors.append(m)
        except zmq.ZMQError:
            self.close()
            raise

    def _read(self, now: float) -> None:
        for i, m in enumerate(self.monitors):
            while m.poll(0):
                event = monitor.recv_monitor_message(m)["event"]
                if self.reconnects[i].seen(event):
                    self.back.add(i)
                if event == zmq.EVENT_CONNECTED:
                    self.down_since[i] = None
                elif event in _DOWN and self.down_since[i] is None:
                    self.down_since[i] = now

    def check(self) -> None:
        """Raise TimeoutError naming a server unreachable for longer than the limit."""
        if self.follow is not None:
            self.follow()
        now = time.monotonic()
        self._read(now)
        for i, since in enumerate(self.down_since):
            if since is not None and now - since > self.limit:
                s = self.shards[i]
                if s.addr in self.leaving:
                    continue
                raise TimeoutError(f"server {s.rank} at {s.addr} has been unreachable for "
                                   f"{now - since:.1f} s (limit {self.limit:g} s): it is gone")

    def came_back(self) -> list[int]:
        """The shards whose connection came back since the last call (read at the last
        check): whatever their server had been sent and not answered is lost."""
        if not self.back:  # (asked at every turn of every wait)
            return []
        back, self.back = sorted(self.back), set()
        return back

    def swap(self, i: int, sock) -> None:
        """Shard `i` is reached through a new socket (its shard moved to its backup)."""
        m = sock.get_monitor_socket(_EVENTS)
        m.linger = 0
        self.monitors[i].close(0)
        self.monitors[i] = m
        self.down_since[i] = None
        self.reconnects[i] = Reconnect(zmq.EVENT_CONNECTED)
        self.back.discard(i)

    def reshard(self, shards: list, old: list) -> None:
        """A new shard map: `shards`, and `old` those watched until now.
        A socket kept (its server kept) keeps its monitor and what it said; a new one gets
        its own; those of dropped sockets close."""
        self.shards = shards
        kept = {id(s.sock): (m, d) for s, m, d in zip(old, self.monitors, self.down_since)}
        monitors, down = [], []
        for s in self.shards:
            m, d = kept.pop(id(s.sock), (None, None))
            if m is None:
                m = s.sock.get_monitor_socket(_EVENTS)
                m.linger = 0
            monitors.append(m)
            down.append(d)
        for m, _ in kept.values():
            m.close(0)
        self.monitors, self.down_since = monitors, down
        self.leaving = frozenset()
        # (indices of the old list; the new map's sends are its own)
        self.reconnects = [Reconnect(zmq.EVENT_CONNECTED) for _ in shards]
        self.back = set()

    def close(self) -> None:
        for m in self.monitors:
            m.close(0)
        self.monitors = []
