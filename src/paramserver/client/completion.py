"""Finishing a client's requests: its replies collected (driving chunked requests as replies
come), turned into the request's result, and a request refused `moved` (the shard map changed
under it) followed and sent again. Also the loans of a pull read in place (`borrow`) and
requests given up on (`abandon`)."""

from __future__ import annotations

import time

import numpy as np

from paramserver.client.core.worker_core import Handle, WorkerCore
from paramserver.client.requests import Moved, ShardRequests
from paramserver.client.shard_map import ShardMap
from paramserver.client.streams import ChunkedRequests, take_values


class Completion:
    """Finishes handles over the client's parts; keeps no state of its own."""

    def __init__(self, core: WorkerCore, requests: ShardRequests, chunked: ChunkedRequests,
                 shard_map: ShardMap, arrival: bool):
        self.core, self.requests, self.chunked, self.map = core, requests, chunked, shard_map
        self.arrival = arrival

    def wait(self, handle: Handle):
        """Finish an async request: a push returns its max staleness, a pull its values.

        A request a server refused `moved` (live resharding: the shard map changed under it)
        is followed: the map it names adopted, a pull sent again whole, a push's or init's
        refused parts sent again under the new map; its result is then the whole request's."""
        since = None
        while True:
            try:
                if handle.moved is not None:
                    moved, handle.moved = handle.moved, None
                    raise moved
                return self._finish(handle)
            except Moved as moved:
                since = time.monotonic() if since is None else since
                again = self.map.follow_moved(handle, moved, since, self.arrival)
                if again is not None:
                    self._become(handle, again)

    def _finish(self, handle: Handle):
        if handle.done:
            return handle.result
        if handle.stream is not None or self.chunked.active:
            # Chunks of any request still to send go out as earlier ones are answered: a
            # pull may wait for a round that only another request's last chunk fills.
            self.chunked.drive(handle)
            if handle.done:
                return handle.result
        replies = self.requests.collect(handle.parts, handle.kind)
        if handle.kind == "push":
            return self.core.push_done(handle, replies)
        if handle.kind == "init":  # -1 from a shard that had its values already
            seen = [m.get("staleness", 0) for m in replies.values()]
            if handle.carried is not None:
                seen.append(handle.carried)
            handle.result, handle.done = min(seen, default=0), True
            return handle.result
        if handle.kind == "pull_rows":
            self.requests.give_back(self.core.rows_done(handle, replies))
            return handle.result
        if handle.delta:
            for shard, rid, where in handle.parts:
                take_values(handle, where, replies[rid])
                self.core.note_version(shard, rid, replies[rid]["version"])
                self.requests.let_go(rid)
            handle.done, handle.result = True, handle.out
            return handle.result
        # Copied out: the server may overwrite the values it lent now.
        self.requests.give_back(self.core.pull_done(handle, replies))
        return handle.result

    def borrow(self, handle: Handle) -> tuple[np.ndarray, int | None]:
        """Finish a pull without copying: (values read in place from the reply, loan). A reply
        from a server on this host lives in its shared arena, which the server does not
        write while lent: hand the loan back (give_back) as soon as the values are read.
        A pull answered by several shards is copied as by wait (loan None)."""
        if handle.done or len(handle.parts) != 1 or handle.stream is not None:
            return self.wait(handle), None
        _, rid, _ = handle.parts[0]
        try:
            reply = self.requests.collect(handle.parts, handle.kind)[rid]
        except Moved as moved:  # followed, and the pull sent again: wait for it as any
            handle.moved = moved
            return self.wait(handle), None
        return self.core.borrowed(handle, reply), rid

    def give_back(self, loan: int | None) -> None:
        """The borrowed values are read: the server may write over them now."""
        if loan is not None:
            self.requests.let_go(loan)

    def abandon(self, handle: Handle) -> None:
        """Give up on an async request: its replies, now or later, are dropped (and frames
        of them that live in a server's arena released)."""
        self.requests.forget(rid for _, rid, _ in handle.parts)
        if handle.stream is not None:
            self.chunked.end(handle)
        handle.done, handle.result = True, None

    def _become(self, handle: Handle, new: Handle) -> None:
        """`handle` (the caller's) takes over `new`, the same request sent again."""
        nbytes = handle.nbytes
        vars(handle).update(vars(new))
        handle.nbytes += nbytes
        self.chunked.replace(new, handle)
