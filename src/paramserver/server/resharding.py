"""Live resharding, a server's part of the protocol (RESHARD_API.md): the move under way and
every decision of it, as a part of the shard core. The rules of layouts and pieces are
server/handoff.py's, the coordinator's part coordinator/resharding.py, the sockets
server/reshard_link.py's. Pure: events in, instructions out.

On `reshard` (ReshardStart) the server sends the keys another server owns now as `handoff`
pieces (SendHandoffs), keeps the rest, and waits for the pieces of its new range
(HandoffPiece); meanwhile it is `moving`, and its node holds workers' requests. Once the range
is whole it says `resharded` once; on the commit the core is rebuilt on it (a Rebuild) under
its new rank, and the held requests are handled (ReleaseHeld). A drained server reports once
its pieces are out, and from its commit on answers requests `moved` (an empty range).
"""

from __future__ import annotations

from dataclasses import replace

from paramserver.server.events import (
    CloseHandoffs, HandoffPiece, JoinMove, LayoutKnown, Log, Rebuild, ReleaseHeld,
    ReshardAbort, ReshardCommit, ReshardStart, SendHandoffs, ToCoordinator,
)
from paramserver.server.handoff import (
    Assembly, HandoffError, Piece, cut, keyed_state, piece_keys, plan, rows_pieces,
)
from paramserver.spec.welcome import ShardAddress

_NOTHING = ()
# Pieces of a reshard that came before its `reshard` (another server heard it first).
MAX_EARLY = 4096


class Resharding:
    """One server's side of live resharding over `core` (a ShardCore): the reshard's epoch,
    this server's entry in the new layout, the assembly of its new range, the pieces that came
    early, and whether it said `resharded` or is drained."""

    def __init__(self, core):
        self.core = core
        self.epoch = 0  # of the reshard under way (moving) or the last one done
        self.new: ShardAddress | None = None  # this server's entry in the new layout
        self.layout: list | None = None
        self.assembly: Assembly | None = None  # not None while moving
        self.floor = 0  # the version the new shard starts at, at least
        self.early: list[HandoffPiece] = []  # pieces of a reshard not heard of yet
        self.drained = False
        self.leaving: ShardAddress | None = None  # drained: its old entry, until the commit
        self.reported = False  # `resharded` said for the move under way

    def handlers(self) -> dict:
        return {JoinMove: self.join, ReshardStart: self.reshard, HandoffPiece: self.piece,
                ReshardCommit: self.commit, ReshardAbort: self.abort}

    @property
    def moving(self) -> bool:
        """From `reshard` until the coordinator's `reshard_commit`: the old core serves
        nothing new (requests wait), and is kept so that a move given up starts again."""
        return self.assembly is not None or self.leaving is not None

    # ---- the joining server ---------------------------------------------------------------------
    def join(self, ev: JoinMove) -> list:
        """The core's range (empty so far) fills from handoffs."""
        core, s = self.core, self.core.settings
        self.epoch, self.new = ev.epoch, ShardAddress(s.rank, ev.addr, s.lo, s.hi)
        self.assembly, self.floor = Assembly(s.lo, s.hi, s.dtype), 0
        self.assembly.rows = core.tables.assembly()  # senders: from its reshard
        out = [Log("info", f"server {core.name} joins at epoch {ev.epoch}: waiting for keys "
                           f"[{s.lo}, {s.hi})")]
        self._take_early(out)
        self._finish_if_whole(out)
        return out

    # ---- the coordinator's `reshard` ------------------------------------------------------------
    def reshard(self, ev: ReshardStart) -> list:
        """Raises HandoffError for a layout that does not fit this server (refused)."""
        core, epoch, out = self.core, ev.epoch, []
        if self.moving and epoch > self.epoch:
            # The move under way was given up (a server of it died and its backup took its
            # place): start this one from the old core, which nothing changed.
            out.append(Log("warning", f"server {core.name}: reshard {self.epoch} given up for "
                                      f"reshard {epoch}"))
            joiner = self.new is not None and self.leaving is None and not any(
                addr == ev.addr for _, addr, *_ in ev.old)
            out += self._abandon()
            if joiner:
                out += self.join(JoinMove(epoch, ev.addr))
        if self.moving and epoch == self.epoch:  # a joiner's reshard, after its welcome
            self.layout = list(ev.layout)
            self.floor = max(self.floor, ev.version)
            if self.assembly.rows is not None:
                self.assembly.rows.expect(rank for rank, *_ in ev.old)
            self._finish_if_whole(out)
            return out
        if epoch <= core.epoch or self.moving:
            if epoch == core.epoch and core.layout is None:  # a joiner that finished first
                out += core.handle(LayoutKnown(epoch, ev.layout, ev.version))
            else:
                moving = ", moving" if self.moving else ""
                out.append(Log("warning", f"server {core.name}: reshard {epoch} ignored (at "
                                          f"epoch {core.epoch}{moving})"))
            return out
        move = plan(epoch, ev.old, ev.layout, ev.addr)  # (HandoffError: refused)
        if move.old is None:
            raise HandoffError(f"server {ev.addr} is not in the old layout of reshard "
                               f"{epoch} and was not welcomed as a joiner")
        out.append(CloseHandoffs())
        rows = core.tables.split(len(ev.layout)) if core.tables else None
        sends = self._sends(epoch, move, ev.layout, ev.addr, rows)
        out += sends
        sent = sum(len(s.messages) for s in sends)
        self.epoch, self.layout = epoch, list(ev.layout)
        if move.drained:
            out += self._drain(move, sent)
            return out
        self.new, self.floor = move.new, ev.version
        self.assembly = Assembly(move.new.lo, move.new.hi, core.settings.dtype)
        if move.kept is not None:
            self.assembly.keep(core.store, *move.kept)
        if rows is not None:
            self.assembly.rows = core.tables.assembly()
            self.assembly.rows.expect(rank for rank, *_ in ev.old if rank != move.old.rank)
            self.assembly.rows.keep(rows[move.new.rank])
        out.append(Log("info", f"server {core.name}: reshard {epoch}, sent "
                               f"{sum(hi - lo for _, lo, hi in move.sends)} key(s) in {sent} "
                               f"piece(s); keys [{move.new.lo}, {move.new.hi}) as rank "
                               f"{move.new.rank}"))
        self._take_early(out)
        self._finish_if_whole(out)
        return out

    def _sends(self, epoch: int, move, layout: list, addr: str,
               rows: list | None) -> list[SendHandoffs]:
        """Every piece for every receiver, one SendHandoffs each: the dense keys it owns now
        and, with sparse tables, the rows it owns now (every other server of the new layout
        gets some, the last saying how many)."""
        core = self.core
        store, s = core.store, core.settings
        per_piece = piece_keys(store.dtype.itemsize, s.max_message_bytes, s.chunk_bytes,
                               1 + len(keyed_state(store)[0]))
        out: dict[str, list] = {}
        for to, lo, hi in move.sends:
            for piece in cut(store, lo, hi, per_piece):
                fields, arrays = piece.message(epoch)
                out.setdefault(to, []).append(("handoff", fields, arrays))
        if rows is not None:
            for rank, to, *_ in layout:
                if to != addr:
                    out.setdefault(to, []).extend(self._rows_messages(epoch, move.old.rank,
                                                                      rows[rank]))
        return [SendHandoffs(to, messages) for to, messages in out.items()]

    def _rows_messages(self, epoch: int, sender: int, bundles: dict) -> list[tuple]:
        """One receiver's `handoff_rows`: pieces under the job's chunk size and half the frame
        limit, the last carrying the count."""
        s, dims = self.core.settings, self.core.tables.dims
        row_bytes = max(8 * (dims[name] + 3) for name in bundles)  # rows, accum, key, age, freq
        per_piece = piece_keys(row_bytes, s.max_message_bytes, s.chunk_bytes)
        pieces = rows_pieces(bundles, per_piece)
        return [("handoff_rows", {"epoch": epoch, "from": sender, "table": name,
                                  "tick": piece.tick,
                                  **({"pieces": len(pieces)} if i == len(pieces) - 1 else {})},
                 piece.frames())
                for i, (name, piece) in enumerate(pieces)]

    def _drain(self, move, sent: int) -> list:
        """Drained: every piece is out; at the commit the core keeps no keys (every request
        is `moved`, a retry of a push applied here still answered) until the coordinator's
        shutdown."""
        core = self.core
        self.leaving, self.reported = move.old, True
        return [ToCoordinator("resharded", {"epoch": self.epoch, "rank": move.old.rank,
                                            "version": core.store.version, "drained": True}),
                Log("info", f"server {core.name} drained at epoch {self.epoch}: {sent} "
                            f"piece(s) sent")]

    # ---- the coordinator's word on the move -----------------------------------------------------
    def commit(self, ev: ReshardCommit) -> list:
        """Every server has its new range: serve it (or, drained, none)."""
        core = self.core
        if not self.moving or ev.epoch != self.epoch or not self.reported:
            return [Log("warning", f"server {core.name}: commit of reshard {ev.epoch} ignored "
                                   f"(at {self.epoch}{'' if self.moving else ', not moving'})")]
        if self.leaving is not None:
            old, self.leaving = self.leaving, None
            settings = replace(core.settings, lo=old.hi, hi=old.hi)
            out = list(core.handle(Rebuild(settings, None, self.epoch, self.layout)))
            self.drained = True
        else:
            asm, new = self.assembly, self.new
            settings = replace(core.settings, rank=new.rank, lo=new.lo, hi=new.hi,
                               servers=len(self.layout) if self.layout
                               else core.settings.servers)
            self.assembly = None
            out = list(core.handle(Rebuild(settings, asm, self.epoch, self.layout,
                                           self.floor)))
            # (after the rebuild: the name and version are the new shard's)
            out.append(Log("info", f"server {core.name} serves keys [{new.lo}, {new.hi}) at "
                                   f"epoch {self.epoch}, version {core.store.version}"))
        self.reported = False
        out.append(ReleaseHeld())
        return out

    def abort(self, ev: ReshardAbort) -> list:
        """The move is given up; the old core, untouched, serves on and answers what was
        held."""
        core = self.core
        if not self.moving or ev.epoch != self.epoch:
            return [Log("warning", f"server {core.name}: abort of reshard {ev.epoch} ignored "
                                   f"(at {self.epoch})")]
        r = core.store.range
        out = [Log("warning", f"server {core.name}: reshard {ev.epoch} given up: serving keys "
                              f"[{r.lo}, {r.hi}) as before")]
        out += self._abandon()
        out.append(ReleaseHeld())
        return out

    def _abandon(self) -> list:
        """Forget the move under way; the old core is untouched, the held requests wait on."""
        self.assembly, self.leaving, self.new, self.reported = None, None, None, False
        return [CloseHandoffs()]

    # ---- handoffs from other servers ------------------------------------------------------------
    def piece(self, ev: HandoffPiece) -> list | tuple:
        """Raises HandoffError for a piece that does not fit the move (refused)."""
        if self.moving and ev.epoch == self.epoch:
            out = []
            self._add(ev)
            self._finish_if_whole(out)
            return out
        if ev.epoch > max(self.epoch, self.core.epoch):
            if len(self.early) >= MAX_EARLY:
                raise HandoffError(f"{MAX_EARLY} handoffs wait for a reshard not heard of")
            self.early.append(ev)
            return _NOTHING
        f = ev.fields
        what = f"rows of table {f['table']!r}" if ev.rows else f"keys [{f['lo']}, {f['hi']})"
        return [Log("warning", f"server {self.core.name}: handoff of {what} for epoch "
                               f"{ev.epoch} dropped (at {self.epoch})")]

    def _add(self, ev: HandoffPiece) -> None:
        f = ev.fields
        if ev.rows:
            if self.assembly.rows is None:
                raise HandoffError("rows of a sparse table came to a server of a job without")
            self.assembly.rows.add(f["from"], f["table"], f["tick"], ev.arrays, f.get("pieces"))
            return
        self.assembly.add(Piece.parse(f, ev.arrays, self.core.settings.dtype))

    def _take_early(self, out: list) -> None:
        now = [p for p in self.early if p.epoch == self.epoch]
        self.early = [p for p in self.early if p.epoch > self.epoch]
        for ev in now:
            # A bad early piece is refused alone: raising here would leave the reshard that
            # is being set up half done.
            try:
                self._add(ev)
            except HandoffError as exc:
                out.append(Log("warning", f"server {self.core.name}: an early handoff from "
                                          f"{ev.src} refused: {exc}"))

    def _finish_if_whole(self, out: list) -> None:
        """The new range is whole: say so once; the old core serves on the commit's word."""
        asm = self.assembly
        if asm is None or self.reported or not asm.whole:
            return
        core, new = self.core, self.new
        self.reported = True
        version = max(asm.version, self.floor, core.store.version)
        out.append(ToCoordinator("resharded", {"epoch": self.epoch, "rank": new.rank,
                                               "version": version}))
        out.append(Log("info", f"server {core.name} holds keys [{new.lo}, {new.hi}) of "
                               f"reshard {self.epoch}: waiting for its commit"))

    def waiting(self, held: int) -> dict | None:
        """What a moving server waits for, for a stall probe (`held`: the workers' requests
        its node holds); None when not moving."""
        if not self.moving:
            return None
        if self.reported:
            return {"op": "reshard_commit", "peer": "coordinator",
                    "note": f"reshard {self.epoch}: every key in, waiting for its commit, "
                            f"{held} request(s) held"}
        missing, rows = self.assembly.missing(), self.assembly.rows
        keys = (f"{len(missing)} run(s) of keys still to come (first {list(missing[0])})"
                if missing else "every key in")
        if rows is not None:
            due = rows.waiting()
            keys += (", the old layout not heard yet" if due is None else
                     f", rows due from server(s) {due}" if due else ", every row in")
        return {"op": "handoff", "peer": "servers",
                "note": f"reshard {self.epoch}: {keys}, {held} request(s) held"}
