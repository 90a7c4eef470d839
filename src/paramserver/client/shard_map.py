"""The shards a client talks to, and following them as they move.

Two things move a client's shards while it runs: a replicated shard's backup taking over (the
coordinator's heartbeat answers name the new primary: `follow_moves` reconnects and sends every
unanswered request again, same ids), and live resharding (`--servers MIN:MAX`: a newer shard
map heard in a release, a heartbeat answer or a server's `moved` refusal is switched to at a
quiet point, `switch`; a refused request is sent again under it, `follow_moved`). ShardMap owns
the list of shards; ShardRequests and ShardLinks are handed each new list, never share one.
The pure bookkeeping of maps heard and taken is LayoutFollower's (core/reshard.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import zmq

from paramserver.client.core.reshard import LayoutFollower
from paramserver.client.core.worker_core import Handle, WorkerCore
from paramserver.client.links import ShardLinks
from paramserver.client.requests import Moved, ShardRequests
from paramserver.client.session import CoordinatorSession
from paramserver.compression import payload
from paramserver.core.keyspace import KeyRange
from paramserver.net.rpc import RemoteError
from paramserver.sparse.placement import shard_of
from paramserver.transport import connect_dealer
from paramserver.wire import Message

log = logging.getLogger("paramserver.client")

# A request refused `moved` under the shard map it already follows (a server that has not
# switched yet) is tried again after a pause growing up to this, for at most its timeout.
MOVED_PAUSE = 0.2


@dataclass
class Shard:
    rank: int
    addr: str
    range: KeyRange
    sock: zmq.Socket


class ShardMap:
    """The client's shards and the shard map it follows. `streams()` lists the chunked
    requests with chunks unanswered (a switch waits for none); `frame_limit(keys)` is the
    largest frame a shard of `keys` keys takes; `rechunk()` redoes the chunking for new
    ranges; `timeout()` is the client's request timeout."""

    def __init__(self, ctx, keys, shards: list[Shard], epoch: int, num_keys: int,
                 session: CoordinatorSession, core: WorkerCore, *,
                 streams: Callable[[], list], frame_limit: Callable[[int], int],
                 rechunk: Callable[[], None], timeout: Callable[[], float]):
        self.ctx, self.keys, self.session, self.core = ctx, keys, session, core
        self.shards = shards
        self.layouts = LayoutFollower(epoch, num_keys)
        self.moved_epoch = 0  # the epoch of the replicas' moves followed (follow_moves)
        self.replaced_seen: dict | None = None  # the session's dead-primary map followed
        self.dense_next = False  # the first compressed pull after a switch goes dense
        self.streams, self.frame_limit = streams, frame_limit
        self.rechunk, self.timeout = rechunk, timeout
        self.requests: ShardRequests | None = None
        self.links: ShardLinks | None = None

    def bind(self, requests: ShardRequests, links: ShardLinks) -> None:
        """The requests and link watch made over this map's shards, told of every change."""
        self.requests, self.links = requests, links

    def _connect(self, addr: str):
        return connect_dealer(self.ctx, addr, send_timeout=self.timeout(), keys=self.keys,
                              peer="server")

    # ---- replicated shards: a backup took over -----------------------------------------------
    def follow_moves(self) -> None:
        """A shard whose backup took over (the coordinator's heartbeat answers say where):
        connect to its new primary and send it every request still unanswered, same ids (its
        dedup table answers a push the dead primary had applied, never applying it twice).
        By address first (a dead primary's successor, whatever reshards renumbered since),
        then by rank under the map the answer was of."""
        replaced = self.session.replaced
        if replaced is not self.replaced_seen:
            self.replaced_seen = replaced
            for i, s in enumerate(self.shards):
                addr, hops = s.addr, 0
                while addr in replaced and hops < len(replaced):
                    addr, hops = replaced[addr], hops + 1
                if addr != s.addr:
                    self._repoint(i, s, addr)
        moved = self.session.moved
        if moved is None or moved[0] == self.moved_epoch:
            return
        self.moved_epoch, where = moved
        if self.moved_epoch < self.layouts.epoch:
            # Said of a shard map older than the one followed (a reshard renumbered the
            # shards since): its ranks are not this map's, and the layout names every
            # primary as it is.
            return
        for i, s in enumerate(self.shards):
            addr = where.get(s.rank)
            if addr is not None and addr != s.addr:
                self._repoint(i, s, addr)

    def _repoint(self, i: int, s, addr: str) -> None:
        sock = self._connect(addr)
        old, s.sock, s.addr = s.sock, sock, addr
        self.requests.swap(old, sock)
        self.links.swap(i, sock)
        old.close(0)
        self.requests.resend(i)

    # ---- live resharding ---------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.layouts.epoch

    def adopt(self, epoch: int, layout) -> bool:
        """Follow shard map `epoch` if newer: at once when quiet, else before the first
        request sent once quiet. True if it is newer."""
        newer = self.heard(epoch, layout, "adopt()")
        if self.layouts.behind and self.quiet():
            self.switch()
        return newer

    def heard(self, epoch, layout, source: str) -> bool:
        try:
            return self.layouts.offer(epoch, layout)
        except ValueError as exc:
            raise RemoteError(f"{source} named a shard map this client cannot follow: "
                              f"{exc}") from None

    def released(self, epoch, layout) -> None:
        """A release names a newer shard map (the coordinator switched maps while every
        worker waited for its release): switched to now, or, with a pull sent ahead still
        in flight, before the next request. The map followed already (said again: a
        restarted coordinator's first release) changes nothing."""
        self.heard(epoch, layout, "the coordinator's release")
        if self.layouts.behind and self.quiet():
            self.switch()

    def quiet(self) -> bool:
        """No request in flight: every one sent is answered (its reply maybe not taken)."""
        core = self.core
        return not self.streams() and all(rid in core.inbox for rid in core.sent)

    def before_request(self) -> None:
        """Before a request is sent: switch to a newer shard map heard of, if quiet (else the
        request goes under the map followed; a server that moved its keys refuses it, and
        the refusal is followed)."""
        heard = self.session.layout
        if heard is None and self.layouts.pending is None:
            return  # (the common case: one look)
        if heard is not None and heard[0] > self.layouts.epoch:
            self.heard(heard[0], heard[1], "a heartbeat answer")
        if self.layouts.behind and self.quiet():
            self.switch()

    def follow_layout(self) -> None:
        """Each wait's look at the shards (ShardLinks.check): a newer shard map heard of is
        switched to when quiet; until then a server it no longer names (drained: it shuts
        down soon) is not judged gone."""
        self.before_request()
        pending = self.layouts.pending
        if pending is not None:
            self.links.leaving = frozenset(s.addr for s in self.shards) - set(pending.addrs)

    def switch(self) -> None:
        """Switch to the pending shard map (no request in flight): one DEALER per address,
        the one already open kept, new ones connected, the others closed; the core's ranges,
        versions and chunking, the requests' polling and limits, the links' monitors follow."""
        layout = self.layouts.take()
        old = self.shards
        by_addr = {s.addr: s for s in old}
        shards = []
        for place in layout.shards:
            kept = by_addr.pop(place.addr, None)
            sock = kept.sock if kept is not None else self._connect(place.addr)
            shards.append(Shard(place.rank, place.addr, KeyRange(place.lo, place.hi), sock))
        self.shards = shards
        self.links.reshard(list(shards), old)
        self.requests.reshard(list(shards), [s.sock for s in old],
                              [self.frame_limit(s.range.size) for s in shards])
        for gone in by_addr.values():
            gone.sock.close(0)
        self.core.reshard(layout.ranges)
        self.rechunk()
        self.dense_next = True
        self.session.flight.record("reshard", epoch=layout.epoch, shards=len(shards))
        log.info("%s %s follows shard map %d: %s", self.session.me.role, self.session.me.rank,
                 layout.epoch, ", ".join(f"s{s.rank} [{s.range.lo}, {s.range.hi}) at {s.addr}"
                                         for s in shards))

    def take_dense(self) -> bool:
        """Whether this pull must go dense (the first compressed one after a switch: what
        each shard thinks this client holds starts again)."""
        dense, self.dense_next = self.dense_next, False
        return dense

    def follow_moved(self, handle: Handle, moved: Moved, since: float,
                     arrival: bool) -> Handle | None:
        """`handle` met a `moved` refusal (its replies all taken): switch to the map it names
        once no other request is in flight, then send it again under that map: a pull whole
        (dense; returned, for the caller's handle to become), a one-message push or init its
        refused parts only, as new requests (None)."""
        resend = handle.again is None
        if resend and handle.kind not in ("push", "init"):
            raise RemoteError(f"{moved}; a {handle.kind} is not sent again under a new shard "
                              f"map") from None
        # A chunk's or round's part refused cannot be told from the rest (a round counts its
        # messages): only one-message parts of arrival-mode pushes (and inits) go again.
        if resend and (handle.stream is not None or (handle.kind == "push" and not arrival)):
            what = "chunked" if handle.stream is not None else "round-mode"
            raise RemoteError(f"a {what} {handle.kind} met a moved shard: {moved}; only one-"
                              f"message pushes in arrival mode are sent again under a new "
                              f"shard map (a policy worker is fenced and never meets this)"
                              ) from None
        newer = self.heard(moved.epoch, moved.layout, f"server {moved.shard}'s refusal")
        others = [h for h in self.streams() if h is not handle]
        if others:
            raise RemoteError(f"{moved}; {len(others)} chunked request(s) still in flight: "
                              f"wait for them before following a new shard map") from None
        self.requests.drain(f"requests in flight before shard map {moved.epoch}")
        if self.layouts.behind:
            self.switch()
        elif not newer and not self.core.stale.issuperset(moved.refused):
            # Refused under the map we follow: its server has not switched yet; a pause.
            waited = time.monotonic() - since
            if waited > self.timeout():
                raise RemoteError(f"{moved}; still refused under shard map "
                                  f"{self.layouts.epoch} after {waited:.0f} s") from None
            time.sleep(min(MOVED_PAUSE, 0.005 + waited / 4))
        if not resend:
            return handle.again()
        answered = [m.get("staleness", 0) for m in moved.replies.values()]
        if handle.carried is not None:
            answered.append(handle.carried)
        if answered:
            handle.carried = max(answered) if handle.kind == "push" else min(answered)
        handle.parts = []
        for request in moved.refused.values():
            for i, msg in self._split_again(request, handle):
                handle.parts.append((i, self.requests.send(i, msg), slice(0, 0)))
        return None

    def _split_again(self, request: Message, handle: Handle) -> list[tuple[int, Message]]:
        """A refused push or init's keys as messages under the map now followed (shard,
        message); encoded values go decoded: the shards add exactly what they stood for."""
        if request is None or request.op not in ("push", "init", "push_sparse", "push_rows"):
            op = None if request is None else request.op
            raise RemoteError(f"a refused {op!r} is not sent again under a new shard map")
        fields = {k: v for k, v in request.fields.items() if k != "wm"}
        versions = self.core.versions
        out = []
        if request.op == "push_rows":  # rows placed by the new server count
            keys, grads = request.arrays[0], request.arrays[1].reshape(request.arrays[0].size, -1)
            owner = shard_of(keys, len(self.shards))
            for i in np.unique(owner).tolist():
                mine = owner == i
                handle.nbytes += keys[mine].nbytes + grads[mine].nbytes
                out.append((i, Message("push_rows", {**fields, "version": versions[i]},
                                       [keys[mine], grads[mine].reshape(-1)])))
            return out
        if request.op == "push_sparse":
            keys = request.arrays[0]
            values = _plain(fields, request.arrays[1:], keys.size)
            for i, (a, b) in enumerate(self.core.sparse_cuts(keys)):
                if a < b:
                    handle.nbytes += keys[a:b].nbytes + values[a:b].nbytes
                    out.append((i, Message("push_sparse", {**fields, "version": versions[i]},
                                           [keys[a:b], values[a:b]])))
            return out
        lo, hi = fields["range"]
        values = _plain(fields, request.arrays, hi - lo)
        for i, p, sl in self.core.pieces(KeyRange(lo, hi)):
            f = {**fields, "range": [p.lo, p.hi]}
            if request.op == "push":
                f["version"] = versions[i]
                handle.nbytes += values[sl].nbytes
            out.append((i, Message(request.op, f, [values[sl]])))
        return out


def _plain(fields: dict, frames: list, size: int) -> np.ndarray:
    """A request's values as plain numbers (decoded when they came encoded; `fields` then
    lose their codec header)."""
    if "enc" not in fields:
        return frames[0]
    values = payload.unpack(fields, frames, size)
    fields.pop("enc")
    fields.pop("enc_opts", None)
    return values
