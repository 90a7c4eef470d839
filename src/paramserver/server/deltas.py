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

Sharing: in round mode every worker pulls the same version transition, and after a dense
refresh they all hold the same reference, so the delta each needs is the same bytes. Each
reference carries a tag naming its contents: equal tags, equal references (values and known
flags, bit for bit). A pull is a step from one tag to the next, determined by the source tag,
the range, the values (the shard's version, within an epoch that `values_replaced()` starts
when a restore replaces values without a version of their own) and the codec with its options
(a pull's codec is built fresh from its options, so its encode is a function of its input).
The first worker to take a step that others holding its tag may take too keeps the step: the
reply's fields and frames and the range of the reference after it. The others get the same
reply and copy that range into their reference: one encode (and one decode) per step, not per
worker, and still the reference is the worker's copy bit for bit. A whole-range dense pull
leads to the same contents from any tag, so a refresh brings every worker to one tag again.
Steps are kept only for the shard's current version (a new version or epoch drops them all),
only while a worker or a kept step leading there holds their source tag (so a worker pulling
in chunks may run ahead of the others and each chunk is still shared), and at most
MAX_STEP_KEYS x the shard's keys of ranges in all (oldest dropped first): 8 bytes per key of
the shard at most.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from paramserver.compression import payload
from paramserver.compression.codec import Codec

MAX_REPLIES = 16
MAX_WORKERS = 256
IDLE_SWEEPS = 16  # per worker held: see "Freeing" above
MAX_STEP_KEYS = 2  # x the shard's keys: the reference ranges shared steps may keep in all
EMPTY = 0  # the tag of a reference that knows nothing (all fresh ones are alike)


class _Held:
    """What one worker holds at the shard: its reference, known flags and their tag."""

    __slots__ = ("values", "known", "tag")

    def __init__(self, size: int):
        self.values = np.zeros(size, np.float32)
        self.known = np.zeros(size, bool)
        self.tag = EMPTY


class _Step(NamedTuple):
    """A pull's effect on a reference of one tag, for the other workers that hold that tag."""

    tag: int  # the reference's tag after it
    a: int  # the range of the reference it sets (shard offsets)
    b: int
    after: np.ndarray  # the range's values after it
    fields: dict  # the reply
    frames: list


class PullRefs:
    """The references of one shard (`lo`: its first key, `size`: its keys)."""

    def __init__(self, lo: int, size: int):
        self.lo, self.size = lo, size
        self._refs: dict[str, _Held] = {}  # sender -> what it holds
        self._replies: dict[str, OrderedDict] = {}  # sender -> rid -> (fields, frames)
        self._sweeps = 0  # pulls served that started at the shard's first key
        # sender -> self._sweeps at its latest pull, least recently served first
        self._seen: OrderedDict[str, int] = OrderedDict()
        self.freed = 0  # workers forgotten for idleness or room
        # Sharing (see above): workers per tag; steps by (source tag or None, a, b, codec key),
        # oldest first, all of the values `_at` names; the steps from each source tag.
        self._holders: dict[int, int] = {}
        self._steps: OrderedDict[tuple, _Step] = OrderedDict()
        self._from: dict[int | None, list[tuple]] = {}
        self._step_keys = 0  # keys of the ranges the steps keep
        self._epoch = 0
        self._at: tuple[int, int] | None = None  # (epoch, version) of the steps kept
        self._tags = EMPTY
        self.encodes = 0  # deltas encoded
        self.shared = 0  # pulls answered by a step another worker's pull took first

    @property
    def workers(self) -> int:
        return len(self._refs)

    @property
    def nbytes(self) -> int:
        """Bytes the references hold (the replies kept for retries and the steps aside)."""
        return sum(h.values.nbytes + h.known.nbytes for h in self._refs.values())

    @property
    def step_bytes(self) -> int:
        """Bytes of reference ranges the shared steps keep (their frames aside)."""
        return 4 * self._step_keys

    def values_replaced(self) -> None:
        """The shard's values changed without a version of their own (a restore): the steps
        of the version they had no longer apply."""
        self._epoch += 1
        self._drop_steps()

    def answered(self, sender: str, rid: int) -> tuple[dict, list] | None:
        """The reply a retried pull got the first time, or None."""
        kept = self._replies.get(sender)
        return None if kept is None else kept.get(rid)

    def dense(self, sender: str, rid: int, lo: int, hi: int, values: np.ndarray,
              head: dict, version: int | None = None) -> tuple[dict, list]:
        """A dense reply (`head`'s fields, `values` of keys [lo, hi)), now what `sender` holds
        there. `version`: the shard's version the values are of (equal versions, equal
        values), so that workers with equal references share the step; None shares nothing."""
        a, b = lo - self.lo, hi - self.lo
        self._served(sender, a)
        held = self._ref(sender)
        whole = a == 0 and b == self.size  # the same contents after it from any tag
        key = self._key(None if whole else held.tag, a, b, None, version)
        step = self._steps.get(key) if key is not None else None
        if step is None:
            held.values[a:b] = values
            held.known[a:b] = True
            frame = held.values[a:b].copy()
            step = self._step(key, held, a, b, frame, dict(head), [frame], whole=whole)
        else:
            self._follow(held, step)
        return self._keep(sender, rid, step.fields, step.frames)

    def delta(self, sender: str, rid: int, lo: int, hi: int, values: np.ndarray,
              codec: Codec, head: dict, version: int | None = None) -> tuple[dict, list]:
        """codec(values - what `sender` holds) as (`head` + enc fields, frames); a range the
        worker holds nothing known of is answered dense instead (its first pull, a restarted
        shard). `version`: as for dense()."""
        a, b = lo - self.lo, hi - self.lo
        held = self._refs.get(sender)
        if held is None or not held.known[a:b].all():  # (dense() counts the pull)
            return self.dense(sender, rid, lo, hi, values, head, version)
        self._served(sender, a)
        key = self._key(held.tag, a, b, codec, version)
        step = self._steps.get(key) if key is not None else None
        if step is None:
            ref = held.values[a:b]
            enc = codec.encode(np.subtract(values, ref, dtype=np.float32))
            self.encodes += 1
            ref += codec.decode(enc, b - a)  # the worker adds the same decoded floats
            fields, frames = payload.as_fields(codec, enc)
            step = self._step(key, held, a, b, ref, {**head, **fields}, frames, view=True)
        else:
            self._follow(held, step)
        return self._keep(sender, rid, step.fields, step.frames)

    def forget(self, sender: str) -> None:
        """Drop what `sender` holds here: its next delta pull is answered dense."""
        held = self._refs.pop(sender, None)
        if held is not None:
            self._release(held.tag)
        self._replies.pop(sender, None)
        self._seen.pop(sender, None)

    # ---- sharing steps (see "Sharing" above) ----------------------------------------------------
    def _key(self, source: int | None, a: int, b: int, codec: Codec | None,
             version: int | None) -> tuple | None:
        """The key of a step, or None when it is not to be shared; steps of other values than
        these (an older version or epoch) are dropped."""
        if version is None:
            return None
        at = (self._epoch, version)
        if at != self._at:
            self._drop_steps()
            self._at = at
        how = None if codec is None else (codec.name, tuple(sorted(codec.options().items())))
        return (source, a, b, how)

    def _step(self, key: tuple | None, held: _Held, a: int, b: int, after: np.ndarray,
              fields: dict, frames: list, whole: bool = False, view: bool = False) -> _Step:
        """The step `held` just took (its range [a, b) now `after`, a view of its reference
        with `view`), to a new tag. It is kept when another may take it: another worker holds
        its source tag, or a kept step leads there (any source, for a `whole` dense pull)."""
        self._tags += 1
        step = _Step(self._tags, a, b, after, fields, frames)
        if key is not None and (whole or self._holders.get(held.tag, 0) > 1):
            if view:  # (a dense step's `after` is its reply frame, already a copy)
                step = step._replace(after=after.copy())
            self._steps[key] = step
            self._from.setdefault(key[0], []).append(key)
            self._step_keys += b - a
            # The step holds its tag for the workers that will come by it: a worker that
            # pulls in chunks goes on from there before the others took its first step.
            self._holders[step.tag] = 1
            while self._step_keys > MAX_STEP_KEYS * self.size:
                self._drop_step(next(iter(self._steps)))
        self._move(held, step.tag)
        return step

    def _follow(self, held: _Held, step: _Step) -> None:
        """`held` takes a step another worker took first: its range becomes what theirs did."""
        held.values[step.a:step.b] = step.after
        held.known[step.a:step.b] = True
        self.shared += 1
        self._move(held, step.tag)

    def _move(self, held: _Held, tag: int) -> None:
        # (held first: leaving the old tag may drop the kept step that holds the new one)
        self._holders[tag] = self._holders.get(tag, 0) + 1
        old, held.tag = held.tag, tag
        self._release(old)

    def _release(self, tag: int) -> None:
        """One holder (a worker or a kept step) fewer of `tag`: when none is left, the steps
        from it are of no use, and the tags they hold lose a holder in turn."""
        tags = [tag]
        while tags:
            tag = tags.pop()
            left = self._holders[tag] - 1
            if left:
                self._holders[tag] = left
                continue
            del self._holders[tag]
            for key in self._from.pop(tag, ()):
                step = self._steps.pop(key, None)
                if step is not None:
                    self._step_keys -= step.b - step.a
                    tags.append(step.tag)

    def _drop_step(self, key: tuple) -> None:
        step = self._steps.pop(key)
        self._step_keys -= step.b - step.a
        keys = self._from[key[0]]
        keys.remove(key)
        if not keys:
            del self._from[key[0]]
        self._release(step.tag)

    def _drop_steps(self) -> None:
        while self._steps:
            self._drop_step(next(iter(self._steps)))

    # ---- who is held ----------------------------------------------------------------------------
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

    def _ref(self, sender: str) -> _Held:
        held = self._refs.get(sender)
        if held is None:
            if len(self._refs) >= MAX_WORKERS:  # room: the least recently served goes
                oldest = next(s for s in self._seen if s != sender and s in self._refs)
                self.forget(oldest)
                self.freed += 1
            held = self._refs[sender] = _Held(self.size)
            self._holders[EMPTY] = self._holders.get(EMPTY, 0) + 1
        return held

    def _keep(self, sender: str, rid: int, fields: dict, frames: list) -> tuple[dict, list]:
        kept = self._replies.setdefault(sender, OrderedDict())
        reply = kept[rid] = (fields, frames)
        while len(kept) > MAX_REPLIES:
            kept.popitem(last=False)
        return reply
