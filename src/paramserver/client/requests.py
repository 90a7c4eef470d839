"""A client's requests to the shard servers: ids, replies matched by id, re-sends, held frames.

Every request is kept until answered and sent again, with its own id, every `retry_interval`
seconds while it is waited on: one may have died with a server that was restarted at the same
address, and servers apply a push only once per (sender, id).
"""

from __future__ import annotations

import time
from typing import Callable

import zmq

from paramserver.net import rpc
from paramserver.net.rpc import RemoteError
from paramserver.transport import shm
from paramserver.wire import Message, WireError


class ShardRequests:
    """Outstanding requests of one client, over one DEALER socket per shard."""

    def __init__(self, shards: list, src: str, next_rid: Callable[[], int], timeout: float,
                 retry_interval: float):
        self.shards, self.src, self.next_rid = shards, src, next_rid
        self.timeout, self.retry_interval = timeout, retry_interval
        self.inbox: dict[int, Message] = {}
        self.sent: dict[int, tuple[int, Message]] = {}  # rid -> (shard, request) unanswered
        self.held: dict[int, list] = {}  # rid -> reply frames that live in a server's arena
        self.retries = 0
        self.poller = zmq.Poller()
        for s in shards:
            self.poller.register(s.sock, zmq.POLLIN)

    def send(self, shard: int, msg: Message) -> int:
        """Send `msg` to a shard; returns its request id."""
        msg.rid, msg.src = self.next_rid(), self.src
        self.sent[msg.rid] = (shard, msg)  # kept to be sent again, same rid, until answered
        self._transmit(shard, msg)
        return msg.rid

    def _transmit(self, shard: int, msg: Message) -> None:
        try:
            rpc.send(self.shards[shard].sock, msg)
        except zmq.Again:
            s = self.shards[shard]
            raise TimeoutError(f"server {s.rank} at {s.addr} accepted no {msg.op!r} for "
                               f"{self.timeout:.0f} s (its queue is full)") from None

    def _retry(self, rids) -> None:
        for rid in rids:
            entry = self.sent.get(rid)
            if entry is not None:  # (None: given up on by an earlier wait that timed out)
                self._transmit(*entry)
                self.retries += 1

    def collect(self, parts: list[tuple[int, int, object]], what: str) -> dict[int, Message]:
        """Wait for the replies to `parts` (shard, rid, ...) or fail naming the silent server."""
        want = {rid: shard for shard, rid, _ in parts}
        now = time.monotonic()
        deadline, retry_at = now + self.timeout, now + self.retry_interval
        while not all(rid in self.inbox for rid in want):
            now = time.monotonic()
            if now >= deadline:
                missing = sorted({want[r] for r in want if r not in self.inbox})
                names = ", ".join(f"server {s} at {self.shards[s].addr}" for s in missing)
                self.forget(want)
                raise TimeoutError(f"{names} did not answer {what} within {self.timeout:.0f} s")
            if now >= retry_at:
                self._retry([r for r in want if r not in self.inbox])
                retry_at = now + self.retry_interval
            self._receive(min(deadline, retry_at) - now)
        replies = {rid: self.inbox.pop(rid) for rid in want}
        for rid in want:
            self.sent.pop(rid, None)
        for rid, reply in replies.items():
            if reply.op == "error":
                for r in want:
                    self.let_go(r)
                raise RemoteError(f"server {want[rid]} refused {what}: {reply['msg']}")
        return replies

    def _receive(self, timeout: float) -> None:
        """Replies that arrive within `timeout` s go to the inbox; an answer to a request
        nobody waits for any more (a retried one answered twice, an abandoned one) is dropped."""
        # Polling every shard (one poller, built once) is as good: other replies go to the inbox.
        for sock, _ in self.poller.poll(max(timeout, 0.0) * 1000):
            _, reply, frames = rpc.recv(sock, routed=False)
            if reply is None:
                continue
            if isinstance(reply, WireError):
                shm.release_frames(frames)
                raise RemoteError(f"a server sent a bad frame: {reply}")
            if reply.rid not in self.sent or reply.rid in self.inbox:
                shm.release_frames(frames)
                continue
            self.inbox[reply.rid] = reply
            if any(isinstance(f, shm.SharedFrame) for f in frames):
                self.held[reply.rid] = frames  # released once copied out (let_go)

    def let_go(self, rid: int) -> None:
        """Done with reply `rid`: frames of it that live in a server's arena are released."""
        frames = self.held.pop(rid, None)
        if frames:
            shm.release_frames(frames)

    def forget(self, rids) -> None:
        """Stop waiting for `rids`: replies already here are released, later ones dropped."""
        for rid in rids:
            self.sent.pop(rid, None)
            if self.inbox.pop(rid, None) is not None:
                self.let_go(rid)
