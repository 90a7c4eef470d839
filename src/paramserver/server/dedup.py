"""Exactly-once pushes: a bounded table of the replies to requests a shard already applied."""

from __future__ import annotations

from collections import OrderedDict

# lookup()'s answer for a request the table cannot prove fresh: it may have been applied.
FORGOTTEN = {"forgotten": True}


class DedupError(ValueError):
    """A push the table will not take: its sender is too far ahead of its acknowledgements,
    or too many senders have pushes waiting to be acknowledged."""


class _Sender:
    """One sender's applied requests still to be remembered, and what it said it is done with."""

    __slots__ = ("seen", "mark", "floor")

    def __init__(self):
        self.seen: OrderedDict[int, dict] = OrderedDict()  # rid -> reply, oldest first
        # The sender's watermark: every request of its below this one has its reply, so it
        # never sends one again (None: a client that sends none, which gets the window).
        self.mark: int | None = None
        self.floor: int | None = None  # the highest rid let go of: at or below, not fresh


class DedupTable:
    """Per sender, the replies to the applied requests it may still retry; `senders` at most.

    A client numbers its requests with increasing ids and retries a request with the same id,
    so a retry is recognised by (sender, rid) and answered with the reply the original got.
    With each push the client sends its watermark (`mark`): the lowest id of a push it still
    waits on. Everything below is acknowledged and never sent again, so the table forgets the
    sender's entries below the watermark and nothing else: an unacknowledged request is never
    forgotten, whatever the pipelining depth and the retry timing. A client keeps at most
    `depth` pushes unacknowledged (it waits before sending more); a push beyond that is
    refused (DedupError), which bounds the table at `depth` entries a sender.

    A request below what the table let go of (the watermark, or for a client that sends none
    the highest rid its last `window` let go of) may have been applied and forgotten: lookup
    says FORGOTTEN and the shard refuses it rather than apply it a second time. (A sender's
    requests reach a shard in the order sent, so a fresh request never comes below.)

    At most `senders` senders are kept: a new one makes room by dropping the least recently
    heard sender with nothing left to remember (its watermark has passed all it pushed), or one
    that sends no watermark; if every sender still has pushes it may retry, the new sender is
    refused (DedupError) rather than any of them forgotten.
    """

    def __init__(self, window: int = 64, senders: int = 1024, depth: int = 1024):
        if window < 1 or senders < 1 or depth < 1:
            raise ValueError("window, senders and depth must be at least 1")
        self.window, self.senders, self.depth = window, senders, depth
        self._table: OrderedDict[str, _Sender] = OrderedDict()

    def lookup(self, sender: str, rid: int, mark: int | None = None) -> dict | None:
        """The reply fields remembered for (sender, rid); FORGOTTEN if it is below what the
        table let go of; None if it was never applied. `mark`, the sender's watermark as this
        request says it, lets the table forget the sender's entries below it first."""
        s = self._table.get(sender)
        if s is None:
            return None
        if mark is not None:
            self._advance(s, min(mark, rid))
        done = s.seen.get(rid)
        if done is None and s.floor is not None and rid <= s.floor:
            return FORGOTTEN
        return done

    def admit(self, sender: str, rid: int) -> None:
        """Raise DedupError if a fresh push (sender, rid) may not be taken (see the class)."""
        s = self._table.get(sender)
        if s is None:
            if len(self._table) >= self.senders and self._evictable() is None:
                raise DedupError(f"{len(self._table)} senders have pushes this shard must "
                                 f"remember until they are acknowledged; a new sender must "
                                 f"wait")
            return
        if s.mark is not None and len(s.seen) >= self.depth:
            raise DedupError(f"sender {sender} has {len(s.seen)} pushes unacknowledged at "
                             f"this shard, at most {self.depth} may be: it must wait for "
                             f"their acks before sending more")

    def remember(self, sender: str, rid: int, reply: dict, mark: int | None = None) -> None:
        """Note that (sender, rid) was applied and answered with `reply`; `mark` as lookup's."""
        s = self._table.get(sender)
        if s is None:
            while len(self._table) >= self.senders:
                gone = self._evictable()
                if gone is None:
                    break  # admit() refuses before this; a restore may overfill, briefly
                del self._table[gone]
            s = self._table[sender] = _Sender()
        else:
            self._table.move_to_end(sender)
        if mark is not None:
            self._advance(s, min(mark, rid))
        s.seen[rid] = dict(reply)
        if s.mark is None:  # no watermark: the last `window` requests
            while len(s.seen) > self.window:
                old, _ = s.seen.popitem(last=False)
                s.floor = old if s.floor is None else max(s.floor, old)

    def _advance(self, s: _Sender, mark: int) -> None:
        """Forget the sender's entries below its watermark `mark` (it never moves back)."""
        if s.mark is not None and mark <= s.mark:
            return
        s.mark = mark
        s.floor = mark - 1 if s.floor is None else max(s.floor, mark - 1)
        seen = s.seen
        while seen:
            oldest = next(iter(seen))
            if oldest >= mark:
                break
            del seen[oldest]

    def _evictable(self) -> str | None:
        """The least recently heard sender that may be forgotten: nothing left it may retry."""
        for name, s in self._table.items():
            if s.mark is None or not s.seen:
                return name
        return None

    def __len__(self) -> int:
        return sum(len(s.seen) for s in self._table.values())

    # ---- checkpoints: the table is part of the shard's state -------------------------------------
    def dump(self) -> list:
        """A JSON-able copy, oldest sender first: [[sender, [[rid, reply], ...]], ...], with the
        sender's floor as a third item once it has let any rid go, and its watermark as a
        fourth once it sent one."""
        out = []
        for name, s in self._table.items():
            row = [name, [[rid, r] for rid, r in s.seen.items()]]
            if s.floor is not None or s.mark is not None:
                row.append(s.floor)
            if s.mark is not None:
                row.append(s.mark)
            out.append(row)
        return out

    @classmethod
    def load(cls, data: list, window: int = 64, senders: int = 1024,
             depth: int = 1024) -> "DedupTable":
        """The inverse of dump (dumps from before floors and watermarks read too)."""
        table = cls(window, senders, depth)
        for sender, entries, *rest in data or []:
            s = table._table[str(sender)] = _Sender()
            if len(rest) > 1:
                s.mark = int(rest[1])
            for rid, reply in entries:
                s.seen[int(rid)] = dict(reply)
            if s.mark is None:
                while len(s.seen) > window:
                    old, _ = s.seen.popitem(last=False)
                    s.floor = old if s.floor is None else max(s.floor, old)
            if rest and rest[0] is not None:
                s.floor = int(rest[0]) if s.floor is None else max(s.floor, int(rest[0]))
        return table
