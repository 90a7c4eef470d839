"""The worker client's bookkeeping, with no sockets, clock or threads: what ps-lite's Customer is
to its KVWorker.

`WorkerCore` hands out request ids, keeps each request until its reply is in, matches replies to
requests (a duplicate or stray one is refused, so the caller drops it), splits a key range into
per-shard pieces, assembles a pull's pieces into the right slices, tracks the version each shard
last answered with and holds the zero-copy frames lent by a server until they are given back;
its `releases` (core/releases.py) keep the release the coordinator sent until it is taken.
Requests, replies and frames are opaque here: the node (client/requests.py) sends, receives and
releases them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from paramserver.client.core.releases import Releases
from paramserver.core.keyspace import KeyRange


@dataclass
class Handle:
    """An outstanding request: its per-shard request ids and how to assemble the replies.

    A request is one-message `parts`, a chunked `stream`, or (a push of a step's dense values
    in chunks beside its tables' rows) both: it is done when both are answered."""

    kind: str
    parts: list[tuple[int, int, Any]] = field(default_factory=list)  # (shard, rid, out slice)
    out: np.ndarray | None = None
    done: bool = False
    result: object = None
    # `out` was made for this pull (the caller gave none): a reply of the worker's own, whole,
    # may stand in for it uncopied (see pull_done).
    out_ours: bool = False
    # A pull_rows of repeated keys asks for each key once: result = out[expand].
    expand: np.ndarray | None = None
    stream: "Stream | None" = None  # the part of the request sent in chunks
    message: Any = None  # a chunked request's chunk -> Message
    nbytes: int = 0  # value bytes the request put on the wire (codec frames as encoded)
    delta: bool = False  # a compressed pull: replies add codec deltas into `out` (or set it)
    # Live resharding: `again()` sends the request anew under the shard map now followed (a
    # pull refused `moved` is redone); `carried` is what the parts answered before a push's
    # refused parts were sent again said (largest staleness; an init's smallest); `moved`,
    # a refusal met while another request was waited on, for wait() to follow.
    again: Any = None
    carried: int | None = None
    moved: Any = None


@dataclass(frozen=True, slots=True)
class Chunk:
    """One message of a chunked request: keys `keys` of shard `shard`, `out` its slice of the
    request's array, the `index`-th of the `count` chunks that shard gets."""

    shard: int
    keys: KeyRange
    out: slice
    index: int
    count: int


def chunk_pieces(pieces: Sequence[tuple[int, KeyRange, slice]],
                 chunk: int | Sequence[int]) -> list[list[Chunk]]:
    """Each piece cut into runs of at most `chunk` keys (or `chunk[k]` for the k-th piece),
    one list per piece (shard order)."""
    out = []
    for k, (shard, r, sl) in enumerate(pieces):
        size = chunk if isinstance(chunk, int) else chunk[k]
        n = -(-r.size // size) if r.size else 1
        runs = []
        for j in range(n):
            lo = r.lo + j * size
            hi = min(lo + size, r.hi)
            runs.append(Chunk(shard, KeyRange(lo, hi),
                              slice(sl.start + lo - r.lo, sl.start + hi - r.lo), j, n))
        out.append(runs)
    return out


class Stream:
    """The chunks of one request, at most `window` of them unanswered per shard: the next one
    goes when an earlier one to the same shard is answered, so neither end holds more than
    window x chunk bytes of it at a time. `window` may differ by shard: one per list of
    `per_shard`."""

    def __init__(self, per_shard: list[list[Chunk]], window: int | Sequence[int]):
        self.todo = [deque(runs) for runs in per_shard]
        self.window = [window] * len(per_shard) if isinstance(window, int) else list(window)
        self.busy = [0] * len(per_shard)  # unanswered chunks, by position in `todo`
        self.waiting: dict[int, tuple[int, Chunk]] = {}  # rid -> (position, chunk), unanswered
        self.most_in_flight = 0  # the largest number unanswered at once, all shards together
        # Messages each shard gets, by shard: a round-mode push says it in `parts`.
        self.counts = {runs[0].shard: len(runs) for runs in per_shard if runs}
        # By shard, from the replies: a push's largest staleness, a pull's oldest version,
        # an init's smallest staleness (-1 if a chunk was ignored).
        self.seen: dict[int, int] = {}

    def ready(self) -> list[tuple[int, Chunk]]:
        """(position, chunk) of the chunks that may go now; the caller sends each and calls
        sent()."""
        out = []
        for pos, todo in enumerate(self.todo):
            room = self.window[pos] - self.busy[pos]
            while room > 0 and todo:
                out.append((pos, todo.popleft()))
                room -= 1
        return out

    def sent(self, pos: int, rid: int, chunk: Chunk) -> None:
        self.busy[pos] += 1
        self.waiting[rid] = (pos, chunk)
        self.most_in_flight = max(self.most_in_flight, len(self.waiting))

    def answered(self, rid: int) -> Chunk:
        """Chunk `rid` has its reply: it leaves its shard's window."""
        pos, chunk = self.waiting.pop(rid)
        self.busy[pos] -= 1
        return chunk

    def drop(self) -> list[int]:
        """Give up: nothing more is sent; returns the rids still unanswered."""
        for todo in self.todo:
            todo.clear()
        rids = list(self.waiting)
        self.waiting.clear()
        self.busy = [0] * len(self.busy)
        return rids

    @property
    def done(self) -> bool:
        return not self.waiting and not any(self.todo)


class WorkerCore:
    """Request ids, unanswered requests, replies, lent frames, shard versions, the release."""

    def __init__(self) -> None:
        self.rid = 0
        self.sent: dict[int, tuple[int, Any]] = {}  # rid -> (shard, request) until answered
        self.inbox: dict[int, Any] = {}  # rid -> reply not yet taken
        self.held: dict[int, Any] = {}  # rid -> frames of a reply lent from a server's arena
        self.rank = 0
        self.num_keys = 0
        self.ranges: list[KeyRange] = []
        self.versions: list[int] = []  # the version each shard last answered a pull with
        self.starts = np.zeros(0, dtype=np.int64)
        self.all_pieces: list[tuple[int, KeyRange, slice]] = []
        # A piece for shard i larger than chunks[i] keys goes as chunks of runs[i] keys,
        # windows[i] unanswered.
        self.chunks: list[int] = []
        self.runs: list[int] = []
        self.windows: list[int] = []
        self.chunk = 1 << 62  # the smallest of `chunks`: most requests are checked in one compare
        self.all_fit = True  # every piece of all_pieces fits its shard's chunk
        self.releases = Releases()  # the coordinator's, as this worker takes them
        # By shard, the rids of pushes sent and maybe not answered, oldest first (an answered
        # one leaves when it reaches the front): the shard's watermark is the first.
        self.pushes: list[deque[int]] = []
        # Requests answered under an older shard map whose replies are not taken yet: their
        # shard numbers are the old map's, so their versions are not noted (see reshard).
        self.stale: set[int] = set()

    def welcome(self, rank: int, ranges: Sequence[KeyRange], num_keys: int) -> None:
        """This worker's rank, the job's key space and the shards' ranges in shard order."""
        self.rank, self.num_keys = int(rank), int(num_keys)
        self.ranges = list(ranges)
        self.versions = [0] * len(self.ranges)
        self.pushes = [deque() for _ in self.ranges]
        self.starts = np.array([r.lo for r in self.ranges], dtype=np.int64)
        # The common request (every key) is split once.
        self.all_pieces = self._split(KeyRange(0, self.num_keys))
        self.chunking(1 << 62, 1)

    def reshard(self, ranges: Sequence[KeyRange]) -> None:
        """Follow a new shard map (live resharding): `ranges` in shard order. Only at a quiet
        point: no request may be unanswered (its shard number would name another shard now).
        The rid counter keeps counting (servers' dedup tables key on sender and rid); each
        new shard's version is the oldest version this worker read of any key it now holds
        (staleness errs high, never low); chunking is reset (the caller sets it again)."""
        if any(rid not in self.inbox for rid in self.sent):
            raise RuntimeError(f"a new shard map with {len(self.unanswered(self.sent))} "
                               f"request(s) unanswered: switch only when none is in flight")
        old, versions = self.ranges, self.versions
        carried = []
        for r in ranges:
            seen = [v for held, v in zip(old, versions) if held.intersect(r) is not None]
            carried.append(min(seen, default=0))
        self.stale = set(self.sent)
        self.welcome(self.rank, ranges, self.num_keys)
        self.versions = carried

    def note_version(self, shard: int, rid: int, version: int) -> None:
        """Shard `shard` answered pull `rid` at `version` (ignored for a request sent under
        an older shard map)."""
        if rid in self.stale:
            self.stale.discard(rid)
        else:
            self.versions[shard] = version

    def chunking(self, chunk: int | Sequence[int], window: int | Sequence[int],
                 run: int | Sequence[int] | None = None) -> None:
        """Pieces above `chunk` keys are sent as chunks of `run` keys (default and at most
        `chunk`), `window` unanswered per shard; each may be one value per shard (in shard
        order) instead of one for all."""
        n = len(self.ranges)

        def per_shard(v) -> list[int]:
            return [int(v)] * n if isinstance(v, (int, np.integer)) else list(map(int, v))
        chunks, windows = per_shard(chunk), per_shard(window)
        runs = chunks if run is None else per_shard(run)
        if not len(chunks) == len(windows) == len(runs) == n:
            raise ValueError(f"chunk sizes and windows for {n} shards, got {len(chunks)}, "
                             f"{len(windows)} and {len(runs)}")
        if min(chunks + runs + windows, default=1) < 1:
            raise ValueError(f"chunks need chunk and run >= 1 key and window >= 1, got "
                             f"{chunk}, {run}, {window}")
        self.chunks, self.windows = chunks, windows
        self.runs = [min(r, c) for r, c in zip(runs, chunks)]
        self.chunk = min(chunks, default=1 << 62)
        self.all_fit = all(p.size <= chunks[i] for i, p, _ in self.all_pieces)

    def stream(self, r: KeyRange, pieces) -> "Stream | None":
        """The chunks of a request for `r` (split into `pieces`), or None when every piece
        fits in one message: the common case costs one comparison."""
        if r.size <= self.chunk:
            return None
        chunks = self.chunks
        if pieces is self.all_pieces:
            if self.all_fit:
                return None
        elif all(p.size <= chunks[i] for i, p, _ in pieces):
            return None
        # A piece over its shard's chunk goes in runs; one under it stays whole (one chunk).
        sizes = [self.runs[i] if p.size > chunks[i] else chunks[i] for i, p, _ in pieces]
        return Stream(chunk_pieces(pieces, sizes), [self.windows[i] for i, _, _ in pieces])

    # ---- key ranges -----------------------------------------------------------------------------
    def key_range(self, keys: KeyRange | tuple[int, int] | None) -> KeyRange:
        """`keys` as a KeyRange inside the key space (None: every key)."""
        r = KeyRange(0, self.num_keys) if keys is None else KeyRange(*keys) if isinstance(
            keys, tuple) else keys
        if r.hi > self.num_keys:
            raise ValueError(f"key range [{r.lo}, {r.hi}) exceeds the {self.num_keys} keys")
        return r

    def pieces(self, r: KeyRange) -> list[tuple[int, KeyRange, slice]]:
        """(shard, piece of `r` it holds, slice of the request) for each shard `r` touches."""
        if r.lo == 0 and r.hi == self.num_keys:
            return self.all_pieces
        return self._split(r)

    def _split(self, r: KeyRange) -> list[tuple[int, KeyRange, slice]]:
        out = []
        for i, held in enumerate(self.ranges):
            part = held.intersect(r)
            if part is not None:
                out.append((i, part, slice(part.lo - r.lo, part.hi - r.lo)))
        return out

    def sparse_cuts(self, keys: np.ndarray) -> list[tuple[int, int]]:
        """For sorted keys: the (start, end) of each shard's run, one per shard (maybe empty)."""
        cuts = np.searchsorted(keys, self.starts[1:], side="left").tolist()
        return list(zip([0, *cuts], [*cuts, keys.size]))

    def owners(self, keys: np.ndarray) -> np.ndarray:
        """The shard that holds each key."""
        return np.searchsorted(self.starts, keys, side="right") - 1

    # ---- requests and replies -------------------------------------------------------------------
    def next_rid(self) -> int:
        self.rid += 1
        return self.rid

    def request(self, shard: int, request: Any, push: bool = False) -> int:
        """A new request to `shard`; kept (to be sent again, same id) until answered. A `push`
        (a request the shard applies once) holds the shard's watermark until answered."""
        self.rid += 1
        self.sent[self.rid] = (shard, request)
        if push:
            self.pushes[shard].append(self.rid)
        return self.rid

    def unacked(self, shard: int) -> int:
        """Pushes to `shard` from its watermark on (an upper bound of those unanswered: one
        answered behind an unanswered one still counts)."""
        self._settle(shard)
        return len(self.pushes[shard])

    def watermark(self, shard: int) -> int:
        """The lowest rid of a push to `shard` not answered yet (the next rid when none is):
        every push below it has its reply, so it is never sent again, and the shard may
        forget it. A push given up on (forget) counts as answered: it is not sent again."""
        self._settle(shard)
        q = self.pushes[shard]
        return q[0] if q else self.rid + 1

    def oldest_push(self, shard: int) -> int | None:
        self._settle(shard)
        q = self.pushes[shard]
        return q[0] if q else None

    def _settle(self, shard: int) -> None:
        q, sent, inbox = self.pushes[shard], self.sent, self.inbox
        while q and (q[0] not in sent or q[0] in inbox):
            q.popleft()

    def unanswered(self, rids: Iterable[int]) -> list[tuple[int, Any]]:
        """(shard, request) of those of `rids` still waited on and not answered yet."""
        return [self.sent[r] for r in rids if r in self.sent and r not in self.inbox]

    def reply(self, rid: int, reply: Any, lent: Any = None) -> bool:
        """A server's reply to request `rid`, its frames `lent` if they live in the server's arena.

        False (refused) for a reply nobody waits for: to an unknown, abandoned or already taken
        request, or a second answer to one answered (a retried request answered twice). The
        caller drops it and gives its lent frames straight back."""
        if rid not in self.sent or rid in self.inbox:
            return False
        self.inbox[rid] = reply
        if lent is not None:
            self.held[rid] = lent
        return True

    def take(self, rids: Iterable[int]) -> dict[int, Any]:
        """The replies to `rids` (all answered): no longer waited on. Lent frames stay held."""
        out = {}
        for rid in rids:
            out[rid] = self.inbox.pop(rid)
            self.sent.pop(rid, None)
        return out

    def let_go(self, rid: int) -> Any:
        """Done with reply `rid`: its lent frames, if any, to give back to the server."""
        return self.held.pop(rid, None)

    def forget(self, rids: Iterable[int]) -> list:
        """Stop waiting for `rids`; later replies are refused. Returns the lent frames of
        replies already in, to give back."""
        lent = []
        for rid in rids:
            self.sent.pop(rid, None)
            if self.inbox.pop(rid, None) is not None:
                frames = self.held.pop(rid, None)
                if frames:
                    lent.append(frames)
        return lent

    # ---- finishing a request --------------------------------------------------------------------
    @staticmethod
    def push_done(handle: Handle, replies: Mapping[int, Any]) -> int:
        """A push's acks are in (its one-message parts' and, with a stream, its chunks'): its
        result is the largest staleness any shard saw."""
        result = max((m.get("staleness", 0) for m in replies.values()), default=0)
        if handle.carried is not None:
            result = max(result, handle.carried)
        if handle.stream is not None:
            result = max(result, max(handle.stream.seen.values(), default=0))
        handle.result, handle.done = result, True
        return result

    def pull_done(self, handle: Handle, replies: Mapping[int, Any]) -> list:
        """A pull's pieces are in: each is copied into its slice of `handle.out` and its shard's
        version noted. Returns the lent frames, free to give back now they are copied.

        A pull the caller gave no `out` for, answered whole by one shard in a frame this process
        owns (one that came through the socket, not lent from a server's arena), is handed over
        as it came: no server can write to it, and the copy would be most of the pull's cost."""
        out, lent = handle.out, []
        if handle.out_ours and len(handle.parts) == 1:
            shard, rid, _ = handle.parts[0]
            values = replies[rid].arrays[0]
            if (rid not in self.held and values.size == out.size and values.dtype == out.dtype
                    and values.flags.writeable):
                self.note_version(shard, rid, replies[rid]["version"])
                handle.result, handle.out, handle.done = values, values, True
                return lent
        return self._assemble(handle, replies)

    def rows_done(self, handle: Handle, replies: Mapping[int, Any]) -> list:
        """A pull_rows' pieces are in: each shard's rows go to the positions of its keys in
        the request (`handle.out` is (len(keys), dim)), and its version is noted. Returns the
        lent frames, as pull_done."""
        return self._assemble(handle, replies)

    def _assemble(self, handle: Handle, replies: Mapping[int, Any]) -> list:
        """Each piece's reply copied to its place in `handle.out` (a slice of a flat array, or
        the row positions of a (keys, dim) one), its shard's version noted; returns the frames
        lent from servers' arenas, which the caller releases."""
        out, lent = handle.out, []
        rows = out.ndim > 1
        for shard, rid, where in handle.parts:
            reply = replies[rid]
            values = reply.arrays[0]
            out[where] = values.reshape(-1, out.shape[1]) if rows else values
            self.note_version(shard, rid, reply["version"])
            reply.arrays = []
            frames = self.held.pop(rid, None)
            if frames:
                lent.append(frames)
        handle.result = out if handle.expand is None else out[handle.expand]
        handle.done = True
        return lent

    def borrowed(self, handle: Handle, reply: Any) -> np.ndarray:
        """A single-shard pull finished without a copy: its values are the reply's, still lent
        (under the handle's one rid) until let go."""
        shard, rid, _ = handle.parts[0]
        self.note_version(shard, rid, reply["version"])
        handle.done, handle.result = True, reply.arrays[0]
        return handle.result

    @property
    def version(self) -> int:
        """The smallest version any shard answered this worker's pulls with."""
        return min(self.versions)

