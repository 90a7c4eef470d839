"""Replicated shards (`--replicas 2`), the pure part: the primary's forwards that its backup
has not acknowledged yet, the replies held until it has, and the state a new backup starts
from. No sockets, no clock: times come in as arguments.

The primary sends every request that changes its shard (init, the pushes, the coordinator's
apply_round) to its backup before it applies it, in the order it handles them, numbered
(`seq`). The backup applies the same requests in the same order with the same rules, so its
values, optimizer state, round and dedup table are the primary's. A reply to such a request
(the worker's ack, or its refusal) is held until the backup has acknowledged that `seq`: an
update is acknowledged once both hold it. Acknowledgements come in order, so the ack of `seq`
releases every reply held up to it.

A backup attached to a running primary first gets the whole state (`sync_payload`, sequence
number 0 of its link), then the forwards; the forwards sent after the sync are in its queue
behind it. Bounded: at most `window` forwards unacknowledged (the node stops reading workers'
requests while the window is full), and a forward unacknowledged for `timeout` s makes the
primary report its backup lost once; the coordinator decides (`Forwarder.dropped`), so a
primary cut off from the coordinator never runs on alone while its backup takes over.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from paramserver.core.bounded import json_value

NONE, SYNCING, LIVE, LOST = "none", "syncing", "live", "lost"


@dataclass(slots=True)
class _Pending:
    seq: int
    sent_at: float
    held: list = field(default_factory=list)  # replies waiting for this seq's ack
    inits: list = field(default_factory=list)  # init replies: kept if this backup is dropped


class Forwarder:
    """The primary's side of one backup link: sequence numbers, the forwards in flight, the
    replies they hold, and whether the backup is synced, live or being reported lost."""

    def __init__(self, window: int = 32, timeout: float = 5.0):
        if window < 1 or timeout <= 0:
            raise ValueError("the forward window must be >= 1 and the timeout > 0")
        self.window, self.timeout = window, timeout
        self.state = NONE
        self.addr: str | None = None
        self.epoch = 0  # the attach this link belongs to: acks of an older link are ignored
        self.seq = 0
        self.acked_seq = 0
        self._pending: deque[_Pending] = deque()
        self.forwards = 0  # requests forwarded, over the shard's life
        self.reported: str | None = None  # why the backup was reported lost (once per link)
        # Replies to inits that no backup holds yet: the next backup's sync releases them.
        self.unsynced_inits: list = []

    # ---- the link -------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Forwards go out and replies wait for the backup (synced or syncing)."""
        return self.state in (SYNCING, LIVE, LOST)

    @property
    def full(self) -> bool:
        """The window is full: take no new request until an ack comes."""
        return len(self._pending) >= self.window

    def attach(self, addr: str, epoch: int, now: float) -> int:
        """A new backup at `addr`: its link starts with the state sync, seq returned. Replies
        held for an earlier backup are released by the caller first (dropped())."""
        if self._pending:
            raise ValueError("attach with forwards of another backup still held: drop first")
        self.state, self.addr, self.epoch = SYNCING, addr, epoch
        self.seq = self.acked_seq = 0
        self.reported = None
        seq = self.forward(now)
        # The sync carries what those inits set: its ack releases their replies.
        self._pending[-1].inits, self.unsynced_inits = self.unsynced_inits, []
        return seq

    def forward(self, now: float) -> int | None:
        """The seq of the next forward, or None without a backup (nothing to wait for)."""
        if not self.active:
            return None
        self.seq += 1
        self._pending.append(_Pending(self.seq, now))
        self.forwards += 1
        return self.seq

    def _waiting(self, seq: int) -> _Pending | None:
        """Forward `seq` while its ack is awaited (None once acknowledged or dropped)."""
        if seq <= self.acked_seq:
            return None
        for p in reversed(self._pending):  # (the newest, almost always)
            if p.seq == seq:
                return p
        return None

    def hold(self, seq: int | None, replies: list) -> list:
        """Keep `replies` until `seq` is acknowledged; returns those that may go now."""
        p = None if seq is None else self._waiting(seq)
        if p is None:
            return replies
        p.held.extend(replies)
        return []

    def hold_init(self, seq: int | None, replies: list) -> list:
        """Keep the replies to an init of a shard not trained yet until a backup holds what it
        set: the ack of `seq` (its forward), or without a backup the next one's sync. Unlike
        hold(), a backup dropped meanwhile does not let them go: they wait for the next one.
        So a replicated shard's start is never acknowledged by one copy alone, and a primary
        that dies before its backup synced leaves the init unanswered, for the worker to send
        again to the backup that takes over (coordinator/orphans.py). Returns those that
        may go now."""
        if not replies:
            return replies
        if seq is None:
            self.unsynced_inits.extend(replies)
            return []
        p = self._waiting(seq)
        if p is None:
            return replies
        p.inits.extend(replies)
        return []

    def acked(self, epoch: int, seq: int) -> tuple[list, bool]:
        """The backup holds everything up to `seq`: (replies to send, whether this ack made
        the backup synced). An ack of another link, or one already had, changes nothing."""
        if epoch != self.epoch or not self.active or seq <= self.acked_seq:
            return [], False
        out = []
        while self._pending and self._pending[0].seq <= seq:
            p = self._pending.popleft()
            out.extend(p.held)
            out.extend(p.inits)
        self.acked_seq = seq
        synced = self.state == SYNCING
        if synced:
            self.state = LIVE
        return out, synced

    def expired(self, now: float) -> str | None:
        """Why the backup must be reported lost (once per link): its oldest forward has waited
        past the timeout. None while all is well or already reported."""
        if self.state not in (SYNCING, LIVE) or not self._pending:
            return None
        oldest = self._pending[0]
        if now - oldest.sent_at <= self.timeout:
            return None
        self.state = LOST
        self.reported = (f"backup at {self.addr} has not acknowledged forward {oldest.seq} "
                         f"for {now - oldest.sent_at:.1f} s (timeout {self.timeout:g} s)")
        return self.reported

    def refused(self, seq: int, why: str) -> str | None:
        """The backup could not apply forward `seq` the way the primary did: it no longer
        mirrors the shard, so it is reported lost (once)."""
        if self.state not in (SYNCING, LIVE):
            return None
        self.state = LOST
        self.reported = f"backup at {self.addr} refused forward {seq}: {why}"
        return self.reported

    def dropped(self) -> list:
        """The coordinator dropped the backup: every held reply goes now (but an init's:
        hold_init), and the shard runs unreplicated until a new backup is attached."""
        out = []
        while self._pending:
            p = self._pending.popleft()
            out.extend(p.held)
            self.unsynced_inits.extend(p.inits)  # (the next backup's sync holds them)
        self.state, self.addr = NONE, None
        return out

    def next_deadline(self) -> float:
        if self.state in (SYNCING, LIVE) and self._pending:
            return self._pending[0].sent_at + self.timeout
        return float("inf")

    @property
    def in_flight(self) -> int:
        return len(self._pending)


# ---- the state a new backup starts from ---------------------------------------------------------
def sync_payload(core) -> tuple[dict, list]:
    """The shard's whole state as (fields, arrays) for a new backup: every array as raw bytes
    (uint8) and one JSON frame naming them, with the store's scalars and round, the dedup table
    and the tables' rows, those of the open round too. JSON and raw frames: nothing here
    unpickles on the other side."""
    arrays, meta = core.store.snapshot()
    arrays.update(core.tables.snapshot())
    arrays.update(core.tables.round_arrays())
    round_meta, round_arrays = core.store.round_state()
    arrays.update(round_arrays)
    names, frames = [], []
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        names.append([name, str(a.dtype), list(a.shape)])
        frames.append(a.reshape(-1).view(np.uint8))
    st = core.settings
    blob = {"meta": meta, "round": round_meta, "arrays": names,
            "applied": core.retries.dump(), "initialized": core.store.initialized,
            "clip": core.clip.state(),
            "initial_saved": core.initial_saved,
            # which shard this is: a backup re-attached after a reshard takes its new one
            "shard": {"rank": st.rank, "lo": st.lo, "hi": st.hi, "servers": st.servers,
                      "epoch": core.epoch, "layout": core.layout}}
    head = np.frombuffer(json.dumps(blob).encode(), dtype=np.uint8)
    return {"arrays_n": len(names)}, [head, *frames]


@dataclass(frozen=True)
class SyncedShard:
    """The shard a state sync is of: its rank, keys [lo, hi), the servers sharing its
    tables, and (live resharding) the shard map's epoch and layout."""

    rank: int
    lo: int
    hi: int
    servers: int
    epoch: int = 0
    layout: list | None = None

    def differs(self, settings) -> bool:
        return (self.rank, self.lo, self.hi, self.servers) != (
            settings.rank, settings.lo, settings.hi, settings.servers)


def synced_shard(arrays: list) -> SyncedShard | None:
    """The shard a `sync` describes (None: a sync of an older version, without it)."""
    if not arrays:
        raise ValueError("a state sync needs its description frame")
    shard = json_value(bytes(arrays[0])).get("shard")
    if shard is None:
        return None
    try:
        out = SyncedShard(int(shard["rank"]), int(shard["lo"]), int(shard["hi"]),
                          int(shard["servers"]), int(shard.get("epoch") or 0),
                          shard.get("layout"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"state sync's shard {shard!r}: {exc}") from None
    if not (0 <= out.lo <= out.hi and out.rank >= 0 and out.servers >= 1):
        raise ValueError(f"state sync's shard {shard!r} does not hold together")
    return out


def read_sync(arrays: list) -> tuple[dict, dict[str, np.ndarray]]:
    """A state sync's frames (sync_payload's, as received) as (its description, its arrays by
    name, views of the frames); ValueError on frames that do not hold together. The core
    takes them in (events.LoadSync)."""
    if not arrays:
        raise ValueError("a state sync needs its description frame")
    blob = json_value(bytes(arrays[0]))
    names = blob["arrays"]
    if len(names) != len(arrays) - 1:
        raise ValueError(f"state sync names {len(names)} arrays but {len(arrays) - 1} came")
    got = {}
    for (name, dtype, shape), raw in zip(names, arrays[1:]):
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        if raw.nbytes != count * dt.itemsize:
            raise ValueError(f"state sync array {name!r}: {raw.nbytes} bytes for {shape} {dt}")
        got[name] = np.frombuffer(raw, dtype=dt).reshape(shape)
    return blob, got


# ---- the forwards' bytes in shared memory (a backup on this host) ------------------------------
class ForwardRing:
    """Where in a primary's shared arena each forward's arrays go, when its backup runs on the
    same host and maps that arena: a ring of `size` bytes used in forward order and freed in
    ack order (acks come in order), so a region is written again only once the backup has
    acknowledged the forward that used it; the backup copies a forward out of the arena before
    it acknowledges it. Offsets only: the node owns the memory. A forward that does not fit
    (the ring holds unacknowledged ones, or it is larger than the ring) goes over the socket."""

    ALIGN = 64

    def __init__(self, size: int):
        if size < self.ALIGN:
            raise ValueError(f"a forward ring of {size} bytes is too small")
        self.size = size
        self._spans: deque[tuple[int, int, int]] = deque()  # (seq, start, end), oldest first
        self._head = 0  # where the next span starts, unless it must wrap

    def take(self, seq: int, nbytes: int) -> int | None:
        """The offset of `nbytes` for forward `seq`, or None when they do not fit now."""
        n = -(-max(nbytes, 1) // self.ALIGN) * self.ALIGN
        if n > self.size:
            return None
        if not self._spans:
            start = 0
        else:
            tail, head = self._spans[0][1], self._head
            if head > tail:
                # used: [tail, head); free: [head, size) then [0, tail)
                start = head if head + n <= self.size else 0 if n <= tail else None
            else:  # wrapped, used: [tail, size) and [0, head); free: [head, tail)
                start = head if head + n <= tail else None
        if start is None:
            return None
        self._spans.append((seq, start, start + n))
        self._head = start + n
        return start

    def release(self, seq: int) -> None:
        """The backup acknowledged every forward up to `seq`: their bytes may be written."""
        while self._spans and self._spans[0][0] <= seq:
            self._spans.popleft()

    def reset(self) -> None:
        """A new backup (or none): nothing is in flight."""
        self._spans.clear()
        self._head = 0

    @property
    def used(self) -> int:
        return len(self._spans)
