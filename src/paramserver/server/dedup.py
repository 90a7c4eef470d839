"""Exactly-once pushes: a bounded table of the replies to requests a shard already applied."""

from __future__ import annotations

from collections import OrderedDict


class DedupTable:
    """Per sender, the replies to its last `window` applied requests; at most `senders` senders.

    A client numbers its requests with increasing ids and retries a request with the same id,
    so a retry is recognised by (sender, rid) and answered with the reply the original got.
    Memory is bounded twice: a sender's oldest entries fall out of its window, and the sender
    heard from least recently falls out when a new one arrives beyond `senders`. A retry comes
    seconds after its original, while a sender has at most a few requests in flight, so a
    window of 64 never forgets a request that can still be retried.
    """

    def __init__(self, window: int = 64, senders: int = 1024):
        if window < 1 or senders < 1:
            raise ValueError("window and senders must be at least 1")
        self.window, self.senders = window, senders
        self._table: OrderedDict[str, OrderedDict[int, dict]] = OrderedDict()

    def lookup(self, sender: str, rid: int) -> dict | None:
        """The reply fields remembered for (sender, rid), or None if it was never applied."""
        seen = self._table.get(sender)
        if seen is None:
            return None
        return seen.get(rid)

    def remember(self, sender: str, rid: int, reply: dict) -> None:
        """Note that (sender, rid) was applied and answered with `reply`."""
        seen = self._table.get(sender)
        if seen is None:
            seen = self._table[sender] = OrderedDict()
            while len(self._table) > self.senders:
                self._table.popitem(last=False)
        else:
            self._table.move_to_end(sender)
        seen[rid] = dict(reply)
        while len(seen) > self.window:
            seen.popitem(last=False)

    def __len__(self) -> int:
        return sum(len(seen) for seen in self._table.values())

    # ---- checkpoints: the table is part of the shard's state -------------------------------------
    def dump(self) -> list:
        """A JSON-able copy, oldest sender first: [[sender, [[rid, reply], ...]], ...]."""
        return [[s, [[rid, r] for rid, r in seen.items()]] for s, seen in self._table.items()]

    @classmethod
    def load(cls, data: list, window: int = 64, senders: int = 1024) -> "DedupTable":
        table = cls(window, senders)
        for sender, entries in data or []:
            for rid, reply in entries:
                table.remember(str(sender), int(rid), reply)
        return table
