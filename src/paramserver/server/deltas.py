"""Compressed pulls (issue 22): what the shard thinks each worker holds, and the codec-encoded
delta from there to the shard's values.

Per worker (by sender name) the shard keeps a float32 reference of its whole range, and which
keys of it are known. A dense pull with `ref` sets the reference to the values it sends; a
delta pull sends codec(values - reference) and adds what that payload decodes to into the
reference, exactly as the worker adds it into its copy: both run the same float32 decode and
add on the same bytes, so the reference stays bit-for-bit the worker's copy. The worker's
drift from the shard is therefore only the last delta's coding error (the error is carried in
the next delta, as error feedback would), and a dense refresh ends it.

Memory: 5 bytes per key of the shard per worker that pulls deltas (the float32 reference and
a known-key flag), plus the last few replies per worker. A retried request must get the reply
it would have got the first time (the reference moved when the first was made), so replies
are kept by request id, MAX_REPLIES per worker.

Freeing: forgetting a worker is always safe, since its next delta pull finds nothing known and
is answered dense, which replaces its copy. So a worker that stopped pulling (it left, died,
or its job ended) is forgotten once the shard has served IDLE_SWEEPS x (workers held) sweeps
since its latest pull; a sweep is a pull that starts at the shard's first key (a whole-model
pull makes one per shard). With W workers pulling once a round, one that left is forgotten
after 16 W / (W - 1) rounds of the others (about 21 with 4 workers), and a straggler keeps its
reference unless it is that many times slower than the rest (a false forget costs it one
dense pull). The shard hears of no departure otherwise (the coordinator tells servers nothing
of membership); `forget(sender)` is there for a caller that does. Beyond MAX_WORKERS the least
recently served worker is forgotten to make room, where a pull used to be refused.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from paramserver.compression import payload
from paramserver.compression.codec import Codec

MAX_REPLIES = 16
MAX_WORKERS = 256
IDLE_SWEEPS = 16  # per worker held: see "Freeing" above


class PullRefs:
    """The references of one shard (`lo`: its first key, `size`: its keys)."""

    def __init__(self, lo: int, size: int):
        self.lo, self.size = lo, size
        self._refs: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # sender -> (values, known)
        self._replies: dict[str, OrderedDict] = {}  # sender -> rid -> (fields, frames)
        self._sweeps = 0  # pulls served that started at the shard's first key
        # sender -> self._sweeps at its latest pull, least recently served first
        self._seen: OrderedDict[str, int] = OrderedDict()
        self.freed = 0  # workers forgotten for idleness or room

    @property
    def workers(self) -> int:
        return len(self._refs)

    @property
    def nbytes(self) -> int:
        """Bytes the references hold (the replies kept for retries aside)."""
        return sum(v.nbytes + k.nbytes for v, k in self._refs.values())

    def answered(self, sender: str, rid: int) -> tuple[dict, list] | None:
        """The reply a retried pull got the first time, or None."""
        kept = self._replies.get(sender)
        return None if kept is None else kept.get(rid)

    def dense(self, sender: str, rid: int, lo: int, hi: int, values: np.ndarray,
              head: dict) -> tuple[dict, list]:
        """A dense reply (`head`'s fields, `values` of keys [lo, hi)), now what `sender` holds
        there."""
        a, b = lo - self.lo, hi - self.lo
        self._served(sender, a)
        ref, known = self._ref(sender)
        ref[a:b] = values
        known[a:b] = True
        return self._keep(sender, rid, dict(head), [ref[a:b].copy()])

    def delta(self, sender: str, rid: int, lo: int, hi: int, values: np.ndarray,
              codec: Codec, head: dict) -> tuple[dict, list]:
        """codec(values - what `sender` holds) as (`head` + enc fields, frames); a range the
        worker holds nothing known of is answered dense instead (its first pull, a restarted
        shard)."""
        a, b = lo - self.lo, hi - self.lo
        held = self._refs.get(sender)
        if held is None or not held[1][a:b].all():  # (dense() counts the pull)
            return self.dense(sender, rid, lo, hi, values, head)
        self._served(sender, a)
        ref = held[0][a:b]
        enc = codec.encode(np.subtract(values, ref, dtype=np.float32))
        ref += codec.decode(enc, b - a)  # the worker adds the same decoded floats
        fields, frames = payload.as_fields(codec, enc)
        return self._keep(sender, rid, {**head, **fields}, frames)

    def forget(self, sender: str) -> None:
        """Drop what `sender` holds here: its next delta pull is answered dense."""
        self._refs.pop(sender, None)
        self._replies.pop(sender, None)
        self._seen.pop(sender, None)

    def _served(self, sender: str, offset: int) -> None:
        """Count a pull of `sender` at `offset` in the shard, and forget the workers idle
        since (see "Freeing" above)."""
        if offset == 0:
            self._sweeps += 1
        self._seen[sender] = self._sweeps
        self._seen.move_to_end(sender)
        idle = self._sweeps - IDLE_SWEEPS * max(1, len(self._seen))
        while self._seen:
            oldest, last = next(iter(self._seen.items()))
            if oldest == sender or last >= idle:
                break
            self.forget(oldest)
            self.freed += 1

    def _ref(self, sender: str) -> tuple[np.ndarray, np.ndarray]:
        held = self._refs.get(sender)
        if held is None:
            if len(self._refs) >= MAX_WORKERS:  # room: the least recently served goes
                oldest = next(s for s in self._seen if s != sender and s in self._refs)
                self.forget(oldest)
                self.freed += 1
            held = self._refs[sender] = (np.zeros(self.size, np.float32),
                                         np.zeros(self.size, bool))
        return held

    def _keep(self, sender: str, rid: int, fields: dict, frames: list) -> tuple[dict, list]:
        kept = self._replies.setdefault(sender, OrderedDict())
        reply = kept[rid] = (fields, frames)
        while len(kept) > MAX_REPLIES:
            kept.popitem(last=False)
        return reply
