"""A client's requests to the shard servers over one DEALER socket per shard: sending, re-sends,
waiting for replies, and giving lent frames back. The bookkeeping (ids, which replies are in,
which frames are lent) is the WorkerCore's (client/core/worker_core.py).

Every request is kept until answered and sent again, with its own id, every `retry_interval`
seconds while it is waited on: one may have died with a server that was restarted at the same
address, and servers apply a push only once per (sender, id). When the connection to a shard is
seen to come back (its server restarted), its unanswered requests go again at once.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import zmq

from paramserver.client.core.worker_core import WorkerCore
from paramserver.core.ratelimit import RefusalLog
from paramserver.net import rpc
from paramserver.net.rpc import RemoteError
from paramserver.transport import shm
from paramserver.wire import Message, WireError

log = logging.getLogger(__name__)


# Requests a shard applies once, by (sender, rid): each carries the sender's watermark (wm).
PUSH_OPS = frozenset(("push", "push_sparse", "push_rows"))


# The longest a wait goes without asking whether its peers are still there.
PEER_CHECK = 0.25


class Moved(RemoteError):
    """A server refused requests with code "moved" (live resharding: it does not hold their
    keys under shard map `epoch`, whose `layout` it names; nothing of them was applied).
    `refused`: rid -> the request refused, as sent; `replies`: rid -> the other replies
    taken with them (their frames already given back)."""

    def __init__(self, msg: str, epoch, layout, refused: dict, replies: dict, shard: int):
        super().__init__(msg)
        self.epoch, self.layout, self.shard = epoch, layout, shard
        self.refused, self.replies = refused, replies


def is_moved(reply) -> bool:
    return reply.op == "error" and reply.get("code") == "moved"


class ShardRequests:
    """Outstanding requests of one client, over one DEALER socket per shard.

    Each push carries the client's watermark for its shard (`wm`, WorkerCore.watermark): the
    shard remembers the pushes it applied from there on, so a retry of any push still waited
    on is answered, never applied twice. At most `max_unacked` pushes to a shard wait for an
    answer: a push beyond waits for the oldest one's first. No array larger than its shard's
    `max_message` bytes is sent: the shard's socket would drop the connection."""

    def __init__(self, shards: list, src: str, core: WorkerCore, timeout: float,
                 retry_interval: float, max_unacked: int = 1 << 30,
                 max_message: list[int] | None = None,
                 check_peers: Callable[[float], None] | None = None,
                 came_back: Callable[[], list[int]] | None = None):
        self.shards, self.src, self.core = shards, src, core
        # Raises when a peer this wait depends on is judged gone (given when the wait began).
        self.check_peers = check_peers
        # The shards whose connection came back since last asked (read by check_peers).
        self.came_back = came_back
        self.timeout, self.retry_interval = timeout, retry_interval
        self.max_unacked = max_unacked
        self.max_message = max_message or [1 << 62] * len(shards)
        self.retries = 0
        # Bad frames from a server are dropped (the request is re-sent, or times out naming
        # the server) and logged at a bounded rate.
        self.refusals = RefusalLog(log.warning, time.monotonic)
        self.poller = zmq.Poller()
        for s in shards:
            self.poller.register(s.sock, zmq.POLLIN)
        # observe.flight.FlightRecorder (the session's), given by the client: sends, replies
        # and the wait in progress, for the coordinator's stall probe.
        self.flight = None
        self._wait = None  # (what, rid -> shard, since) while _await waits

    @property
    def inbox(self) -> dict:
        """Replies in and not yet taken, by request id."""
        return self.core.inbox

    @property
    def held(self) -> dict:
        """Frames lent from a server's arena, by request id, until let go."""
        return self.core.held

    def send(self, shard: int, msg: Message) -> int:
        """Send `msg` to a shard; returns its request id."""
        limit = self.max_message[shard]
        for a in msg.arrays:
            if a.nbytes > limit:
                raise ValueError(f"an array of {a.nbytes} bytes in one {msg.op!r} to server "
                                 f"{self.shards[shard].rank}; its messages may hold at most "
                                 f"{limit} bytes (max_message_bytes)")
        push = msg.op in PUSH_OPS
        if push:
            core = self.core
            while core.unacked(shard) >= self.max_unacked:  # wait for the oldest's ack
                self._await({core.oldest_push(shard): shard}, all, msg.op)
        msg.rid, msg.src = self.core.request(shard, msg, push), self.src
        self._transmit(shard, msg)
        return msg.rid

    def _transmit(self, shard: int, msg: Message) -> None:
        if msg.op in PUSH_OPS:  # (a retry says the watermark as it is now)
            msg.fields["wm"] = self.core.watermark(shard)
        if self.flight is not None:
            self.flight.record("send", op=msg.op, shard=shard, rid=msg.rid)
        try:
            rpc.send(self.shards[shard].sock, msg)
        except zmq.Again:
            s = self.shards[shard]
            raise TimeoutError(f"server {s.rank} at {s.addr} accepted no {msg.op!r} for "
                               f"{self.timeout:.0f} s (its queue is full)") from None

    def collect(self, parts: list[tuple[int, int, object]], what: str) -> dict[int, Message]:
        """Wait for the replies to `parts` (shard, rid, ...) or fail naming the silent server."""
        want = {rid: shard for shard, rid, _ in parts}
        self._await(want, all, what)
        inbox, sent = self.core.inbox, self.core.sent
        # The requests refused, as sent (a `moved` one is sent again under the new map).
        refused = {rid: sent[rid][1] for rid in want if inbox[rid].op == "error"}
        replies = self.core.take(want)
        if refused:
            self._refused(want, replies, refused, what)
        return replies

    def _refused(self, want: dict, replies: dict, refused: dict, what: str) -> None:
        for r in want:
            self.let_go(r)
        for rid in refused:
            reply = replies[rid]
            if not is_moved(reply):
                raise RemoteError(f"server {want[rid]} refused {what}: {reply['msg']}")
        # Every error is a `moved`: the caller follows the newest map named.
        newest = max((replies[r] for r in refused), key=lambda m: m.get("epoch", -1))
        shard = want[next(iter(refused))]
        raise Moved(f"{self._shard_name(shard)} refused {what}: {newest['msg']} (shard map "
                    f"{newest.get('epoch', '?')})", newest.get("epoch"), newest.get("layout"),
                    refused, {r: m for r, m in replies.items() if r not in refused}, shard)

    def drain(self, what: str) -> None:
        """Wait until no request is unanswered (the replies stay in for their callers)."""
        inbox = self.core.inbox
        want = {rid: shard for rid, (shard, _) in self.core.sent.items() if rid not in inbox}
        if want:
            self._await(want, all, what)

    def wait_any(self, parts: list[tuple[int, int, object]], what: str) -> None:
        """Wait until a reply to any of `parts` (shard, rid, ...) is in, left in the inbox for
        collect(); re-sends and the deadline as collect's. (Chunked requests take replies as
        they come: one shard's may wait for a version while another's are due.)"""
        self._await({rid: shard for shard, rid, _ in parts}, any, what)

    def _await(self, want: dict[int, int], enough, what: str) -> None:
        """Receive until `enough` (all or any) of the requests `want` (rid -> shard) have
        replies, re-sending the unanswered every retry_interval; past the timeout, forget them
        and fail naming the servers still silent."""
        since = time.monotonic()
        flight = self.flight
        if flight is None:
            self._await_loop(want, enough, what, since)
            return
        before, self._wait = (flight.waiting, self._wait), (what, want, since)
        flight.waiting = self._describe_wait
        try:
            self._await_loop(want, enough, what, since)
        finally:
            flight.waiting, self._wait = before

    def _describe_wait(self) -> dict | None:
        """The wait in progress as a probe reports it: the op, the shards still silent and
        the first one's key range (read from the heartbeat thread: copies, no iteration)."""
        wait = self._wait
        if wait is None:
            return None
        what, want, since = wait
        inbox = self.core.inbox
        silent = sorted({shard for rid, shard in list(want.items()) if rid not in inbox})
        if not silent:
            return None
        first = self.shards[silent[0]]
        return {"op": what, "peer": ", ".join(f"server {self.shards[i].rank}" for i in silent),
                "range": [first.range.lo, first.range.hi],
                "for_s": round(time.monotonic() - since, 3)}

    def _await_loop(self, want: dict[int, int], enough, what: str, since: float) -> None:
        inbox = self.core.inbox
        now = since
        deadline, retry_at = now + self.timeout, now + self.retry_interval
        while not enough(rid in inbox for rid in want):
            now = time.monotonic()
            if self.check_peers is not None:
                try:
                    self.check_peers(since)
                except TimeoutError:
                    self.forget(want)
                    raise
            if self.came_back is not None:
                for shard in self.came_back():
                    self.resend(shard)
            if now >= deadline:
                missing = sorted({want[r] for r in want if r not in inbox})
                names = ", ".join(f"server {s} at {self.shards[s].addr}" for s in missing)
                self.forget(want)
                raise TimeoutError(f"{names} did not answer {what} within {self.timeout:.0f} s")
            if now >= retry_at:
                for entry in self.core.unanswered(want):
                    self._transmit(*entry)
                    self.retries += 1
                retry_at = now + self.retry_interval
            self._receive(min(deadline, retry_at, now + PEER_CHECK) - now)

    def _receive(self, timeout: float) -> None:
        """Replies that arrive within `timeout` s go to the core; one it refuses (to a request
        nobody waits for any more: retried and answered twice, abandoned) is dropped."""
        # Polling every shard (one poller, built once) is as good: other replies wait in the core.
        for sock, _ in self.poller.poll(max(timeout, 0.0) * 1000):
            _, reply, frames = rpc.recv(sock, routed=False)
            if reply is None:
                continue
            if isinstance(reply, WireError):
                shm.release_frames(frames)
                name = self._name(sock)
                self.refusals.refused(name, f"dropped a bad frame from {name}: {reply}")
                continue
            if self.flight is not None:
                self.flight.record("recv", op=reply.op, rid=reply.rid)
            # Frames in a server's arena stay lent (the server leaves them be) until let go.
            lent = frames if any(isinstance(f, shm.SharedFrame) for f in frames) else None
            if not self.core.reply(reply.rid, reply, lent):
                shm.release_frames(frames)

    def swap(self, old: zmq.Socket, new: zmq.Socket) -> None:
        """A shard's DEALER replaced (its shard moved): poll the new one."""
        self.poller.unregister(old)
        self.poller.register(new, zmq.POLLIN)

    def reshard(self, shards: list, old: list, max_message: list[int]) -> None:
        """The shards were replaced by `shards` (a new shard map; `old`: the sockets polled
        until now): poll the new ones."""
        self.shards = shards
        for sock in old:
            self.poller.unregister(sock)
        for s in self.shards:
            self.poller.register(s.sock, zmq.POLLIN)
        self.max_message = list(max_message)

    def resend(self, shard: int) -> None:
        """Send every unanswered request to `shard` again, same ids."""
        core = self.core
        for rid, (where, msg) in list(core.sent.items()):
            if where == shard and rid not in core.inbox:
                self._transmit(where, msg)
                self.retries += 1

    def _shard_name(self, i: int) -> str:
        # (a reply to a request sent under an older shard map may name a shard gone since)
        if i < len(self.shards):
            return f"server {self.shards[i].rank} at {self.shards[i].addr}"
        return f"server {i}"

    def _name(self, sock) -> str:
        return next((f"server {s.rank} at {s.addr}" for s in self.shards if s.sock is sock),
                    "a server")

    def let_go(self, rid: int) -> None:
        """Done with reply `rid`: frames of it that live in a server's arena are released."""
        frames = self.core.let_go(rid)
        if frames:
            shm.release_frames(frames)

    def forget(self, rids) -> None:
        """Stop waiting for `rids`: replies already here are released, later ones dropped."""
        self.give_back(self.core.forget(rids))

    @staticmethod
    def give_back(lent: list) -> None:
        """Release frames lent from servers' arenas (a list of each reply's frames)."""
        for frames in lent:
            shm.release_frames(frames)
