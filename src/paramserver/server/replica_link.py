"""A replicated shard's I/O (`--replicas 2`): as a primary, the DEALER to its backup, what is
forwarded on it and the replies held until the backup has acknowledged; as a backup, what it
takes from its primary and acknowledges. The rules are server/replication.py's Forwarder;
the coordinator's part is coordinator/replicas.py.

A forward carries the request as it came: its header bytes as the first (uint8) array, then
its arrays, under the original sender and request id, so the backup decodes it with the wire
codec's checks and its core applies it exactly as the primary's did (its dedup table keyed
the same). The backup answers `fwd_ack` after each one; a refusal there means the copies
differ, and the primary reports the backup lost.

A backup on the same host (loopback addresses, shared memory not turned off) maps the primary's
forward arena (transport.shm): the primary copies each forward's large arrays into it (one
memcpy, a fraction of a second TCP transfer's CPU on loopback) and only a descriptor crosses
the socket. Before it acknowledges, the backup applies a dense push from the arena and copies
any other forward's arrays out into its own memory, so an acknowledged update never lives only
in the primary's memory; the primary writes a region again only after the ack of the forward
that used it (replication.ForwardRing). The backup
also posts each ack in its own arena (transport.shm.publish: attach epoch and seq in one word),
where the primary reads it as soon as it has applied its own copy: on two busy cores the ack
message waits for both processes' I/O threads, often longer than the backup took to copy.

A backup watches its primary: the sync names the primary's address, and the backup keeps an
idle DEALER connected to it with a ZeroMQ socket monitor (as client/links.py watches a
worker's shards; not on its own ROUTER, whose one monitor the CURVE guard owns). A dropped
connection means the primary is probably gone (a killed process's sockets close at once): it
says so (`primary_down`), and the coordinator promotes it once the primary has also been
silent for a short deadline, instead of a whole heartbeat timeout.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np
import zmq
from zmq.utils import monitor

from paramserver.net import rpc
from paramserver.server.events import LoadSync, Reply
from paramserver.server.replication import (
    ForwardRing, Forwarder, sync_payload, synced_shard,
)
from paramserver.transport import connect_dealer, shm
from paramserver.wire import Message, WireError
from paramserver.wire.codec import decode, encode
from paramserver.wire.protocol import CONTROL_MESSAGE_BYTES

log = logging.getLogger(__name__)

# Requests that change a shard: forwarded to its backup before the primary applies them.
# (A clipped round's factor too: the backup, which holds the same round, applies the same one.)
FORWARDED = frozenset(("init", "push", "push_sparse", "push_rows", "apply_round", "clip_factor",
                       "load_state"))
FROM_COORDINATOR = frozenset(("attach_backup", "backup_dropped", "promote"))
# What a backup's DEALER to its primary watches: the connection up (its handshake done), then
# dropping; or, not up yet, its connect refused (no process listens there any more). A
# handshake refused means a key mismatch, not a death: that watch then says nothing.
_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_WATCHED = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
            | _FAILED)
# Forwards in flight per backup; below the DEALER's high-water mark (64), so a send never
# waits: a full window stops the primary reading workers' requests instead.
WINDOW = 32
# The forward arena: room for a few forwards of the whole shard in flight, within bounds (a
# chunked push's forwards are chunks: 64 MB holds four of the default 16 MB).
RING_MIN, RING_MAX, RING_SHARDS = 4 << 20, 64 << 20, 4
# Replies carrying values held for the backup's ack (hold_read) are copies: past this many
# bytes held (or this many shards' worth, if more), the primary stops reading requests until
# acks release them, as a full window does, so a stalled or lost backup costs bounded memory.
HELD_READ_BYTES, HELD_READ_SHARDS = 64 << 20, 4
# Where a backup posts its acks in its arena's header, as epoch << ACK_BITS | seq.
ACK_SLOT, ACK_BITS = 0, 40
# Forwards whose arrays the backup's core is done with once it has handled them (a dense push
# is applied, or added into the round's sum, at once): read from the primary's arena in place,
# then acknowledged, instead of copied out first. Any other op's arrays may be kept (a round's
# rows wait for the round) and are copied out.
APPLIED_IN_PLACE = frozenset(("push",))


class ReplicaLink:
    """One server's side of its shard's replication. `core` is the ShardCore, `execute` runs
    core instructions, `to_coordinator(op, fields)` tells the coordinator."""

    def __init__(self, ctx: zmq.Context, keys, backup: bool, timeout: float,
                 core, execute, to_coordinator, addr: str = "", feed=None):
        self.ctx, self.keys = ctx, keys
        # feed(event): the core takes an event of this link's and the node follows it (its
        # name, its settings); without a node (a test's link), the core alone takes it.
        self.feed = feed if feed is not None else core.handle
        self.addr = addr  # this server's: a primary names it in the sync (its backup watches)
        self.backup = backup  # a backup until promoted
        self.core, self.execute, self.to_coordinator = core, execute, to_coordinator
        self.forwarder = Forwarder(WINDOW, timeout)
        self.sock: zmq.Socket | None = None  # the primary's DEALER to its backup
        # A backup's primary: the ROUTER peer of the latest state sync, and its attach epoch.
        self.primary: bytes | None = None
        self.epoch = 0
        self.map_epoch = 0  # the shard map's epoch this server was promoted at
        self.applied = 0  # forwards a backup applied
        # A backup's watch on its primary: an idle DEALER to it and that DEALER's monitor.
        self.watcher: zmq.Socket | None = None
        self.monitor: zmq.Socket | None = None
        self.watching: str | None = None  # the address the watcher connects to
        self.up = False  # the watcher's connection is up
        self.told = False  # primary_down said (or muted) since it was last up
        # A primary's arena for forwards to a backup on this host (made at its first attach),
        # the ring of regions in it, and the bytes it lets the backup read instead of receive.
        self.arena: shm.Arena | None = None
        self.ring: ForwardRing | None = None
        self._ring_bytes: np.ndarray | None = None
        self.shared_bytes = 0
        self.held_read_bytes = 0  # copies of value replies waiting for an ack (hold_read)

    @property
    def rank(self) -> int:
        """The shard's rank: its core's (a reshard renumbers it, a re-attached backup mirrors
        another shard)."""
        return self.core.settings.rank

    # ---- the primary ----------------------------------------------------------------------------
    @property
    def full(self) -> bool:
        """Take no request from workers now: the forward window is full, or the value
        replies held for acks reached their bound."""
        return self.forwarder.full or self.held_read_bytes >= self._read_cap()

    def _read_cap(self) -> int:
        values = self.core.store.values
        return max(HELD_READ_BYTES, HELD_READ_SHARDS * values.numel() * values.element_size())

    def _release(self, released: list) -> None:
        """Replies an ack (or the backup's drop) lets go: sent, and the copies among them no
        longer counted."""
        self.held_read_bytes -= sum(sum(a.nbytes for a in r.arrays)
                                    for r in released if type(r) is Reply and r.committed)
        self.execute(released)

    def forwards(self, op: str) -> bool:
        return self.forwarder.active and op in FORWARDED

    def forward(self, msg: Message, header) -> int:
        """Send the request (`header`: its raw header frame, or None to encode it) to the
        backup; its seq, by which its replies are held."""
        fw = self.forwarder
        seq = fw.forward(time.monotonic())
        if header is None:
            header = encode(Message(msg.op, msg.fields, rid=msg.rid, src=msg.src))[0]
        head = np.frombuffer(getattr(header, "buffer", header), dtype=np.uint8)
        arrays = msg.arrays
        if self.ring is not None and arrays and shm.shared_with(self.sock):
            arrays = self._in_arena(seq, arrays)
        try:
            rpc.send(self.sock, Message("fwd", {"seq": seq, "epoch": fw.epoch},
                                        [head, *arrays], rid=msg.rid, src=msg.src))
        except zmq.Again:  # (the window keeps below the high-water mark: not expected)
            self._report(fw.refused(seq, "its queue is full"))
        return seq

    def _in_arena(self, seq: int, arrays: list) -> list:
        """`arrays` with the large ones copied into the forward arena (sent by reference); one
        that does not fit in the ring now goes over the socket as it is."""
        out = []
        for a in arrays:
            if a.nbytes >= shm.MIN_BYTES:
                off = self.ring.take(seq, a.nbytes)
                if off is not None:
                    dst = self._ring_bytes[off:off + a.nbytes].view(a.dtype)
                    np.copyto(dst, a.reshape(-1), casting="no")
                    self.shared_bytes += a.nbytes
                    a = dst
            out.append(a)
        return out

    def _share(self, addr: str) -> None:
        """Offer the forward arena to a backup on this host (made at the first attach, kept
        for the next backups); the backup maps it, or declines and forwards go as bytes."""
        if not (shm.enabled() and shm.local_address(addr)):
            return
        if self.arena is None:
            values = self.core.store.values
            size = min(max(RING_SHARDS * values.numel() * values.element_size(), RING_MIN),
                       RING_MAX)
            try:
                self.arena = shm.Arena(size)
            except OSError:  # (no memfd here): forwards go as bytes
                return
            self._ring_bytes = self.arena.alloc(size, np.uint8)
            self.ring = ForwardRing(size)
        self.ring.reset()
        shm.offer_shared(self.sock, self.arena, 0)

    def hold_read(self, reply: Reply) -> bool:
        """Hold a reply carrying values while forwards are unacknowledged, until the newest
        is: the values may hold writes the backup has not, which must not be seen unless
        both copies keep them (a primary deposed meanwhile never sends them). Held as a copy,
        so later writes do not show through; False when nothing is pending (sent at once)."""
        fw = self.forwarder
        if not fw.active or fw.seq <= fw.acked_seq:
            return False
        self.shared_ack()
        if fw.seq <= fw.acked_seq:
            return False
        copy = Reply(reply.to, reply.op, reply.fields,
                     [np.array(a, copy=True) for a in reply.arrays], committed=True)
        if fw.hold(fw.seq, [copy]):
            return False
        self.held_read_bytes += sum(a.nbytes for a in copy.arrays)
        return True

    @staticmethod
    def hold_out(token, instructions) -> tuple[list, list]:
        """(the replies to request `token`, the other instructions)."""
        held, rest = [], []
        for ins in instructions:
            (held if type(ins) is Reply and ins.to == token else rest).append(ins)
        return held, rest

    def holds_init(self) -> bool:
        """An init taken now is a replicated shard's before training: its ack waits for a
        backup that holds its values (hold(init=True))."""
        core = self.core
        return core.settings.replicas > 1 and core.store.version == 0

    def hold(self, seq: int | None, replies: list, init: bool = False) -> list:
        """The replies to request `seq` (forwarded; None: not) that may go now. `init`: an
        init of a replicated shard not trained yet, whose ack waits for a backup that holds
        its values, whatever backup that is (Forwarder.hold_init)."""
        fw = self.forwarder
        out = fw.hold_init(seq, replies) if init else fw.hold(seq, replies)
        self.shared_ack()  # the backup may hold it already (it copies while we apply)
        return out

    def shared_ack(self) -> None:
        """Take the ack the backup posted in its arena, if it is on this host: the same as its
        fwd_ack message, which may still be on its way (and then changes nothing)."""
        if self.sock is None:
            return
        posted = shm.peer_counter(self.sock, ACK_SLOT)
        if posted:
            self._acked(posted >> ACK_BITS, posted & ((1 << ACK_BITS) - 1))

    def from_backup(self) -> None:
        """Drain the backup's acknowledgements: the replies they release go out."""
        for _ in range(256):
            try:
                _, msg, _ = rpc.recv_nowait(self.sock, False)
            except zmq.Again:
                return
            if msg is None or isinstance(msg, WireError) or msg.op != "fwd_ack":
                continue
            fw = self.forwarder
            if msg.get("refused"):
                self._report(fw.refused(msg["seq"], msg["refused"]))
                continue
            self._acked(msg["epoch"], msg["seq"])

    def _acked(self, epoch: int, seq: int) -> None:
        fw = self.forwarder
        released, synced = fw.acked(epoch, seq)
        if self.ring is not None:
            self.ring.release(fw.acked_seq)
        if released:
            self._release(released)
        if synced:
            log.info("shard %d: backup at %s synced", self.rank, fw.addr)
            self.to_coordinator("backup_synced", {"rank": self.rank, "epoch": fw.epoch,
                                                  "version": self.core.store.version})

    def tick(self, now: float) -> None:
        self.shared_ack()
        self._report(self.forwarder.expired(now))

    def next_deadline(self) -> float:
        return self.forwarder.next_deadline()

    def _report(self, why: str | None) -> None:
        if why is None:
            return
        log.warning("shard %d: %s; held replies wait for the coordinator's word", self.rank,
                    why)
        self.to_coordinator("backup_lost", {"rank": self.rank, "epoch": self.forwarder.epoch,
                                            "reason": why})

    def routes(self, router: zmq.Socket, events: dict) -> tuple[dict, dict]:
        """The ops this link takes, as the node routes them: from peers on `router` (a
        primary's forwards and syncs, the sender's role checked) as {op: (role,
        handler(ident, msg, frames))}, and from the coordinator as {op: handler(msg)}.
        `events`: the node's op -> event parsers, which a backup applies forwards with."""
        def take(ident, msg, frames):
            self.take(router, ident, msg, events, frames)
        return ({"fwd": ("server", take), "sync": ("server", take)},
                dict.fromkeys(FROM_COORDINATOR, self.from_coordinator))

    def from_coordinator(self, msg: Message) -> None:
        """attach_backup, backup_dropped, promote (after which the server's name is its
        shard's: `backup` is False)."""
        if msg["rank"] != self.rank:
            return
        if msg.op == "promote":
            self.backup, self.primary = False, None
            self.map_epoch = msg["epoch"]
            self._point_watch(None)  # nothing to watch any more
            log.warning("shard %d: promoted to primary (epoch %d) at version %d", self.rank,
                        msg["epoch"], self.core.store.version)
            return
        if msg.op == "backup_dropped":
            if msg["epoch"] == self.forwarder.epoch:
                log.warning("shard %d: backup dropped; serving unreplicated", self.rank)
                self._drop()
            return
        if msg.op == "attach_backup" and not self.backup:
            self._drop()
            fw = self.forwarder
            self.sock = connect_dealer(self.ctx, msg["addr"], keys=self.keys, send_timeout=0,
                                       max_message=CONTROL_MESSAGE_BYTES, peer="server")
            self._share(msg["addr"])
            seq = fw.attach(msg["addr"], msg["epoch"], time.monotonic())
            fields, arrays = sync_payload(self.core)
            fields.update(seq=seq, epoch=fw.epoch)
            if self.addr:
                fields["addr"] = self.addr  # the backup watches it (from_monitor)
            # (a copy: the values change under a zero-copy send still in flight)
            rpc.send(self.sock, Message("sync", fields, [np.array(a) for a in arrays],
                                        src=f"s{self.rank}"))
            log.info("shard %d: attaching backup at %s (epoch %d)", self.rank, msg["addr"],
                     fw.epoch)

    def _drop(self) -> None:
        released = self.forwarder.dropped()
        if released:
            self._release(released)
        if self.ring is not None:
            self.ring.reset()
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None

    # ---- the backup -----------------------------------------------------------------------------
    def take(self, router: zmq.Socket, ident: bytes, msg: Message, events: dict,
             frames=()) -> None:
        """A `sync` or `fwd` from the primary: acknowledged once it is here and parses (the
        backup holds it; it is applied next, before anything else is read), then applied. A
        forward is acknowledged before it is applied so that its apply overlaps the primary's
        ack to the worker instead of delaying it. `frames`: as received; arrays read from the
        primary's arena are copied out first (the primary reuses that memory after the ack,
        and this copy must not depend on the primary's process), except a dense push's: it is
        applied from the arena, then acknowledged (the copy and the add each take one pass over
        the push, so the ack comes about as soon, and the backup saves the copy)."""
        seq, epoch = msg["seq"], msg["epoch"]
        refused, inner = None, None
        if not self.backup:
            refused = f"shard {self.rank}'s server here is a primary now"
        elif msg.op == "sync":
            if epoch < self.epoch:
                refused = f"sync of attach {epoch}, this backup is on attach {self.epoch}"
            else:
                shard, mirror = synced_shard(msg.arrays), None
                if shard is not None and shard.differs(self.core.settings):
                    # Re-attached after live resharding: a backup of the shard the sync is of.
                    mirror = replace(self.core.settings, rank=shard.rank, lo=shard.lo,
                                     hi=shard.hi, servers=shard.servers)
                self.feed(LoadSync(list(msg.arrays), mirror))
                self.primary, self.epoch = ident, epoch
                self.watch_primary(msg.get("addr"))
                log.info("shard %d: backup synced at version %d (attach %d)", self.rank,
                         self.core.store.version, epoch)
        elif ident != self.primary or epoch != self.epoch:
            refused = "forward from a primary this backup was not synced with"
        else:
            refused, inner = self._parse(msg)
            if inner is not None and any(type(f) is shm.SharedFrame for f in frames):
                if inner.op in APPLIED_IN_PLACE:
                    self._apply(inner, seq, events)
                    inner = None
                else:
                    inner.arrays = [np.array(a) for a in inner.arrays]
        fields = {"seq": seq, "epoch": epoch}
        if refused:
            fields["refused"] = refused[:200]
        elif seq < 1 << ACK_BITS:
            shm.publish(router, ACK_SLOT, epoch << ACK_BITS | seq)  # for a primary on this host
        rpc.send_or_drop(router, Message("fwd_ack", fields, src=f"b{self.rank}"), ident)
        if inner is not None:
            self._apply(inner, seq, events)

    @staticmethod
    def _parse(msg: Message) -> tuple[str | None, Message | None]:
        """(why it is refused, None) or (None, the forwarded request)."""
        if not msg.arrays:
            return "forward without the request's header", None
        try:
            inner = decode([msg.arrays[0], *msg.arrays[1:]])
        except WireError as exc:
            return f"forwarded request does not parse: {exc}", None
        if inner.op not in FORWARDED:
            return f"op {inner.op!r} is not forwarded", None
        return None, inner

    def _apply(self, inner: Message, seq: int, events: dict) -> None:
        token = ("fwd", seq)
        try:
            event = events[inner.op](inner, token)
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            # The primary refused it the same way before its core saw it: nothing applied.
            log.info("shard %d backup: forward %d refused: %s", self.rank, seq, exc)
            return
        # The replies (acks, or refusals the primary's core made the same way) go nowhere.
        _, rest = self.hold_out(token, self.core.handle(event))
        self.execute(rest)
        self.applied += 1

    def watch_primary(self, addr: str | None) -> None:
        """A backup synced by the primary at `addr`: an idle DEALER to it, whose monitor says
        when the connection drops (from_monitor, when `monitor` is readable). It sends
        nothing; a primary that names no address is not watched (its death waits for the
        heartbeat timeout)."""
        if self.watcher is None and addr:
            # Watched before it connects: a handshake done before its monitor was there
            # would never say the watch is up.
            self.watcher = connect_dealer(self.ctx, None, keys=self.keys, send_timeout=0,
                                          max_message=CONTROL_MESSAGE_BYTES, peer="server")
            self.monitor = self.watcher.get_monitor_socket(_WATCHED)
            self.monitor.linger = 0
        self._point_watch(addr)

    def _point_watch(self, addr: str | None) -> None:
        """Point the watcher at `addr` (None: at nothing). Its DEALER and monitor stay open
        until close(): a monitor torn down beside a live socket can stall the context's I/O
        thread, so the watch is only disconnected, and what its monitor says is read on."""
        if self.watcher is None or addr == self.watching:
            return
        if self.watching is not None:
            try:
                self.watcher.disconnect(self.watching)
            except zmq.ZMQError:  # (never connected there: nothing to undo)
                pass
        if addr:
            self.watcher.connect(addr)
        self.watching, self.up, self.told = addr, False, False

    def from_monitor(self) -> None:
        """A synced backup whose primary's connection dropped tells the coordinator, once per
        connection; the coordinator weighs it against the primary's heartbeats."""
        m = self.monitor
        while m is not None and m.poll(0):
            event = monitor.recv_monitor_message(m)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.up, self.told = True, False
            elif event & _FAILED:
                self.up, self.told = False, True
                log.warning("shard %d backup: its primary refused the watch's handshake; its "
                            "death is judged by its silence", self.rank)
            elif ((event == zmq.EVENT_DISCONNECTED and self.up)
                  or (event == zmq.EVENT_CONNECT_RETRIED and not self.up)):
                self.up = False
                if not self.told and self.backup and self.primary is not None:
                    self.told = True
                    log.warning("shard %d backup: its primary's connection dropped", self.rank)
                    self.to_coordinator("primary_down", {"rank": self.rank,
                                                         "epoch": self.epoch})

    def _unwatch(self) -> None:
        """At the end only (see _point_watch): the watched socket first, then its monitor;
        the context's bounded termination follows."""
        if self.watcher is not None:
            self.watcher.close(0)
            self.monitor.close(0)
            self.watcher = self.monitor = self.watching = None
            self.up = self.told = False

    def close(self) -> None:
        if self.forwarder.forwards:
            log.info("shard %d: %d forwards to backups, %.1f MB of them through shared memory",
                     self.rank, self.forwarder.forwards, self.shared_bytes / 1e6)
        self._unwatch()
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None
