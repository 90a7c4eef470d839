"""Live resharding, a server's I/O (RESHARD_API.md): the rules are server/handoff.py's, the
coordinator's part coordinator/reshard.py.

On `reshard` the server sends the keys another server owns now as `handoff` pieces on a
DEALER it opens to that server, keeps the rest, and waits for the pieces of its new range;
meanwhile workers' requests are queued (bounded: "busy" beyond). Once the range is whole the
core rebuilds itself on it (a Rebuild event) under its new rank, reports `resharded`
and handles the queued requests. A drained server reports once its pieces are out and then
answers requests `moved` (its core's range is empty) until the coordinator says `shutdown`.

The handoff DEALERs stay open until the next reshard or the end: a DEALER closed at once
(LINGER 0) would drop pieces not yet delivered, and the coordinator's commit, which waits for
every receiver, says when they were.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace

import zmq

from paramserver.net import rpc
from paramserver.server.events import LayoutKnown, Rebuild
from paramserver.server.handoff import (
    Assembly, HandoffError, Piece, cut, keyed_state, piece_keys, plan, rows_pieces,
)
from paramserver.spec.welcome import ShardAddress
from paramserver.transport import connect_dealer
from paramserver.transport.zmq_sockets import DEFAULT_HWM
from paramserver.wire import Message
from paramserver.wire.protocol import CONTROL_MESSAGE_BYTES

log = logging.getLogger(__name__)

# Workers' requests held while the shard moves (after `reshard`, before the rebuild); the
# fence keeps policy workers quiet then, so these are observers' and bare KV clients'. Their
# replies go out in one burst after the rebuild: no more than a peer's send queue surely
# holds (a ROUTER drops what is over its high-water mark, and the queue's count of what was
# sent on is updated every half of that mark).
MAX_QUEUED = DEFAULT_HWM // 2
# Pieces of a reshard that came before its `reshard` (another server heard it first).
MAX_EARLY = 4096


class ReshardLink:
    """One server's side of live resharding. `node` is its ServerNode: the link reads its
    core, settings and address, and feeds the core its events (node.feed)."""

    def __init__(self, ctx: zmq.Context, keys, node):
        self.ctx, self.keys, self.node = ctx, keys, node
        self.epoch = 0  # of the reshard under way (moving) or the last one done
        self.new: ShardAddress | None = None  # this server's entry in the new layout
        self.layout: list | None = None
        self.assembly: Assembly | None = None  # not None while moving
        self.floor = 0  # the version the new shard starts at, at least
        self.queued: deque = deque()  # (ident, msg, frames) of workers, while moving
        self.early: list[Message] = []  # handoffs of a reshard not heard of yet
        self.drained = False
        self.socks: list[zmq.Socket] = []  # handoff DEALERs of the last reshard
        self.busy = 0  # requests refused "busy" while moving
        self.leaving: ShardAddress | None = None  # drained: its old entry, until the commit
        self.reported = False  # `resharded` said for the move under way

    @property
    def moving(self) -> bool:
        """From `reshard` until the coordinator's `reshard_commit`: the old core serves
        nothing new (requests wait), and is kept so that a move given up starts again."""
        return self.assembly is not None or self.leaving is not None

    def routes(self) -> tuple[dict, dict]:
        """The ops this link takes, as the node routes them: other servers' pieces (their
        role checked) as {op: (role, handler(ident, msg, frames))}, and the coordinator's
        word on a move as {op: handler(msg)}."""
        def piece(ident, msg, frames):
            self.piece(msg)
        return ({"handoff": ("server", piece), "handoff_rows": ("server", piece)},
                {"reshard": self.reshard, "reshard_commit": self.commit,
                 "reshard_abort": self.abort})

    # ---- the joining server ---------------------------------------------------------------------
    def join(self, epoch: int) -> None:
        """A welcome with `handoff`: the core's range (empty so far) fills from handoffs."""
        s = self.node.settings
        self.epoch, self.new = epoch, ShardAddress(s.rank, self.node.addr, s.lo, s.hi)
        self.assembly, self.floor = Assembly(s.lo, s.hi, s.dtype), 0
        self.assembly.rows = self.node.core.tables.assembly()  # senders: from its reshard
        log.info("server %s joins at epoch %d: waiting for keys [%d, %d)", self.node.src,
                 epoch, s.lo, s.hi)
        self._take_early()
        self._finish_if_whole()

    # ---- the coordinator's `reshard` ------------------------------------------------------------
    def reshard(self, msg: Message) -> None:
        epoch, core = msg["epoch"], self.node.core
        if self.moving and epoch > self.epoch:
            # The move under way was given up (a server of it died and its backup took its
            # place): start this one from the old core, which nothing changed.
            log.warning("server %s: reshard %d given up for reshard %d", self.node.src,
                        self.epoch, epoch)
            joiner = self.new is not None and self.leaving is None and not any(
                addr == self.node.addr for _, addr, *_ in msg["old"])
            self._abandon()
            if joiner:
                self.join(epoch)
        if self.moving and epoch == self.epoch:  # a joiner's reshard, after its welcome
            self.layout = list(msg["layout"])
            self.floor = max(self.floor, msg.get("version", 0))
            if self.assembly.rows is not None:
                self.assembly.rows.expect(rank for rank, *_ in msg["old"])
            self._finish_if_whole()
            return
        if epoch <= core.epoch or self.moving:
            if epoch == core.epoch and core.layout is None:  # a joiner that finished first
                self.node.feed(LayoutKnown(epoch, msg["layout"], msg.get("version", 0)))
            else:
                log.warning("server %s: reshard %d ignored (at epoch %d%s)", self.node.src,
                            epoch, core.epoch, ", moving" if self.moving else "")
            return
        node = self.node
        move = plan(epoch, msg["old"], msg["layout"], node.addr)  # (HandoffError: refused)
        if move.old is None:
            raise HandoffError(f"server {node.addr} is not in the old layout of reshard "
                               f"{epoch} and was not welcomed as a joiner")
        self._close()
        rows = core.tables.split(len(msg["layout"])) if core.tables else None
        sent = self._send(epoch, move, msg["layout"], rows)
        self.epoch, self.layout = epoch, list(msg["layout"])
        if move.drained:
            self._drain(move, sent)
            return
        self.new, self.floor = move.new, msg.get("version", 0)
        self.assembly = Assembly(move.new.lo, move.new.hi, node.settings.dtype)
        if move.kept is not None:
            self.assembly.keep(core.store, *move.kept)
        if rows is not None:
            self.assembly.rows = core.tables.assembly()
            self.assembly.rows.expect(rank for rank, *_ in msg["old"] if rank != move.old.rank)
            self.assembly.rows.keep(rows[move.new.rank])
        log.info("server %s: reshard %d, sent %d key(s) in %d piece(s); keys [%d, %d) as "
                 "rank %d", node.src, epoch, sum(hi - lo for _, lo, hi in move.sends), sent,
                 move.new.lo, move.new.hi, move.new.rank)
        self._take_early()
        self._finish_if_whole()

    def _send(self, epoch: int, move, layout: list, rows: list | None) -> int:
        """Every piece for every receiver, on a DEALER each: the dense keys it owns now and,
        with sparse tables, the rows it owns now (every other server of the new layout gets
        some, the last saying how many). How many pieces went."""
        node = self.node
        store = node.core.store
        per_piece = piece_keys(store.dtype.itemsize, node.settings.max_message_bytes,
                               node.settings.chunk_bytes, 1 + len(keyed_state(store)[0]))
        out: dict[str, list[Message]] = {}
        for addr, lo, hi in move.sends:
            for piece in cut(store, lo, hi, per_piece):
                fields, arrays = piece.message(epoch)
                out.setdefault(addr, []).append(Message("handoff", fields, arrays, src=node.src))
        if rows is not None:
            for rank, addr, *_ in layout:
                if addr != node.addr:
                    out.setdefault(addr, []).extend(self._rows_messages(epoch, move.old.rank,
                                                                        rows[rank]))
        for addr, messages in out.items():
            # The queue holds every piece (a receiver still binding takes them late): a send
            # never waits.
            sock = connect_dealer(self.ctx, addr, hwm=max(DEFAULT_HWM, len(messages) + 1),
                                  send_timeout=0, keys=self.keys, peer="server",
                                  max_message=CONTROL_MESSAGE_BYTES)
            self.socks.append(sock)
            for message in messages:
                rpc.send(sock, message)
        return sum(map(len, out.values()))

    def _rows_messages(self, epoch: int, sender: int, bundles: dict) -> list[Message]:
        """One receiver's `handoff_rows`: pieces under the job's chunk size and half the frame
        limit, the last carrying the count."""
        s, dims = self.node.settings, self.node.core.tables.dims
        row_bytes = max(8 * (dims[name] + 3) for name in bundles)  # rows, accum, key, age, freq
        per_piece = piece_keys(row_bytes, s.max_message_bytes, s.chunk_bytes)
        pieces = rows_pieces(bundles, per_piece)
        return [Message("handoff_rows", {"epoch": epoch, "from": sender, "table": name,
                                         "tick": piece.tick,
                                         **({"pieces": len(pieces)} if i == len(pieces) - 1
                                            else {})},
                        piece.frames(), src=self.node.src)
                for i, (name, piece) in enumerate(pieces)]

    def _drain(self, move, sent: int) -> None:
        """Drained: every piece is out; at the commit the core keeps no keys (every request
        is `moved`, a retry of a push applied here still answered) until the coordinator's
        shutdown."""
        node = self.node
        self.leaving, self.reported = move.old, True
        node.notify("resharded", {"epoch": self.epoch, "rank": move.old.rank,
                                  "version": node.core.store.version, "drained": True})
        log.info("server %s drained at epoch %d: %d piece(s) sent", node.src, self.epoch, sent)

    # ---- the coordinator's word on the move -----------------------------------------------------
    def commit(self, msg: Message) -> None:
        """`reshard_commit`: every server has its new range: serve it (or, drained, none)."""
        node, epoch = self.node, msg["epoch"]
        if not self.moving or epoch != self.epoch or not self.reported:
            log.warning("server %s: commit of reshard %d ignored (at %d%s)", node.src, epoch,
                        self.epoch, "" if self.moving else ", not moving")
            return
        if self.leaving is not None:
            old, self.leaving = self.leaving, None
            settings = replace(node.settings, lo=old.hi, hi=old.hi)
            node.feed(Rebuild(settings, None, self.epoch, self.layout))
            self.drained = True
        else:
            asm, new = self.assembly, self.new
            settings = replace(node.settings, rank=new.rank, lo=new.lo, hi=new.hi,
                               servers=len(self.layout) if self.layout
                               else node.settings.servers)
            self.assembly = None
            node.feed(Rebuild(settings, asm, self.epoch, self.layout, self.floor))
            log.info("server %s serves keys [%d, %d) at epoch %d, version %d", node.src,
                     new.lo, new.hi, self.epoch, node.core.store.version)
        self.reported = False
        self._release_held()

    def abort(self, msg: Message) -> None:
        """`reshard_abort`: the move is given up; the old core, untouched, serves on and
        answers what was held."""
        epoch = msg["epoch"]
        if not self.moving or epoch != self.epoch:
            log.warning("server %s: abort of reshard %d ignored (at %d)", self.node.src, epoch,
                        self.epoch)
            return
        log.warning("server %s: reshard %d given up: serving keys [%d, %d) as before",
                    self.node.src, epoch, self.node.core.store.range.lo,
                    self.node.core.store.range.hi)
        self._abandon()
        self._release_held()

    def _release_held(self) -> None:
        """The workers' requests held while moving, handled now, in order."""
        queued, self.queued = self.queued, deque()
        for ident, msg, frames in queued:
            self.node.handle_worker(ident, msg, frames)

    def _abandon(self) -> None:
        """Forget the move under way; the old core is untouched, the held requests wait on."""
        self.assembly, self.leaving, self.new, self.reported = None, None, None, False
        self._close()

    # ---- handoffs from other servers ------------------------------------------------------------
    def piece(self, msg: Message) -> None:
        epoch = msg["epoch"]
        if self.moving and epoch == self.epoch:
            self._add(msg)
            self._finish_if_whole()
        elif epoch > max(self.epoch, self.node.core.epoch):
            if len(self.early) >= MAX_EARLY:
                raise HandoffError(f"{MAX_EARLY} handoffs wait for a reshard not heard of")
            self.early.append(msg)
        else:
            what = (f"rows of table {msg['table']!r}" if msg.op == "handoff_rows"
                    else f"keys [{msg['lo']}, {msg['hi']})")
            log.warning("server %s: handoff of %s for epoch %d dropped (at %d)",
                        self.node.src, what, epoch, self.epoch)

    def _add(self, msg: Message) -> None:
        if msg.op == "handoff_rows":
            if self.assembly.rows is None:
                raise HandoffError("rows of a sparse table came to a server of a job without")
            self.assembly.rows.add(msg["from"], msg["table"], msg["tick"], msg.arrays,
                                   msg.get("pieces"))
            return
        self.assembly.add(Piece.parse(msg.fields, msg.arrays, self.node.settings.dtype))

    def _take_early(self) -> None:
        now, self.early = [m for m in self.early if m["epoch"] == self.epoch], \
            [m for m in self.early if m["epoch"] > self.epoch]
        for msg in now:
            # A bad early piece is refused alone: raising here would leave the reshard that
            # is being set up half done.
            try:
                self._add(msg)
            except HandoffError as exc:
                log.warning("server %s: an early handoff from %s refused: %s", self.node.src,
                            msg.src, exc)

    def _finish_if_whole(self) -> None:
        """The new range is whole: say so once; the old core serves on the commit's word."""
        asm = self.assembly
        if asm is None or self.reported or not asm.whole:
            return
        node, new = self.node, self.new
        self.reported = True
        version = max(asm.version, self.floor, node.core.store.version)
        node.notify("resharded", {"epoch": self.epoch, "rank": new.rank, "version": version})
        log.info("server %s holds keys [%d, %d) of reshard %d: waiting for its commit",
                 node.src, new.lo, new.hi, self.epoch)

    def waiting(self) -> dict | None:
        """What a moving server waits for, for a stall probe; None when not moving."""
        if not self.moving:
            return None
        if self.reported:
            return {"op": "reshard_commit", "peer": "coordinator",
                    "note": f"reshard {self.epoch}: every key in, waiting for its commit, "
                            f"{len(self.queued)} request(s) held"}
        missing, rows = self.assembly.missing(), self.assembly.rows
        keys = (f"{len(missing)} run(s) of keys still to come (first {list(missing[0])})"
                if missing else "every key in")
        if rows is not None:
            due = rows.waiting()
            keys += (", the old layout not heard yet" if due is None else
                     f", rows due from server(s) {due}" if due else ", every row in")
        return {"op": "handoff", "peer": "servers",
                "note": f"reshard {self.epoch}: {keys}, {len(self.queued)} request(s) held"}

    # ---- workers' requests while moving ---------------------------------------------------------
    def hold(self, ident, msg: Message, frames) -> bool:
        """Queue a worker's request while moving (True); over the bound it is answered
        "busy". False when not moving: handle it now."""
        if not self.moving:
            return False
        if len(self.queued) >= MAX_QUEUED:
            self.busy += 1
            rpc.send_or_drop(self.node.router, Message("error", {
                "msg": f"server {self.node.src} is moving keys (reshard {self.epoch}) and "
                       f"holds {MAX_QUEUED} requests already: retry", "code": "busy"},
                rid=msg.rid, src=self.node.src), ident)
            return True
        # (frames of a zero-copy receive: kept as they are, the request handled later)
        self.queued.append((ident, msg, frames))
        return True

    def _close(self) -> None:
        for sock in self.socks:
            sock.close(0)
        self.socks = []

    def close(self) -> None:
        self._close()
