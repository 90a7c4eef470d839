"""Exactly-once pushes: a bounded table of the replies to requests a shard already applied."""

from __future__ import annotations

from collections import OrderedDict

# lookup()'s answer for a request older than the window remembers: it may have been applied.
FORGOTTEN = {"forgotten": True}


class DedupTable:
    """Per sender, the replies to its last `window` applied requests; at most `senders` senders.

    A client numbers its requests with increasing ids and retries a request with the same id,
    so a retry is recognised by (sender, rid) and answered with the reply the original got.
    Memory is bounded twice: a sender's oldest entries fall out of its window, and the sender
    heard from least recently falls out when a new one arrives beyond `senders`. Each sender
    keeps the highest rid that fell out of its window (its floor): a retry at or below it may
    have been applied and forgotten, so lookup says FORGOTTEN and the shard refuses it rather
    than apply it a second time. (A sender's requests reach a shard in the order sent, so a
    fresh request never comes below the floor.)
    """

    def __init__(self, window: int = 64, senders: int = 1024):
        if window < 1 or senders < 1:
            raise ValueError("window and senders must be at least 1")
        self.window, self.senders = window, senders
        self._table: OrderedDict[str, OrderedDict[int, dict]] = OrderedDict()
        self._floor: dict[str, int] = {}  # per sender, the highest rid forgotten

    def lookup(self, sender: str, rid: int) -> dict | None:
        """The reply fields remembered for (sender, rid); FORGOTTEN if it is at or below what
        the window let go of; None if it was never applied."""
        seen = self._table.get(sender)
        if seen is None:
            return None
        done = seen.get(rid)
        if done is None:
            floor = self._floor.get(sender)
            if floor is not None and rid <= floor:
                return FORGOTTEN
        return done

    def remember(self, sender: str, rid: int, reply: dict) -> None:
        """Note that (sender, rid) was applied and answered with `reply`."""
        seen = self._table.get(sender)
        if seen is None:
            seen = self._table[sender] = OrderedDict()
            while len(self._table) > self.senders:
                gone, _ = self._table.popitem(last=False)
                self._floor.pop(gone, None)
        else:
            self._table.move_to_end(sender)
        seen[rid] = dict(reply)
        while len(seen) > self.window:
            old, _ = seen.popitem(last=False)
            if old > self._floor.get(sender, -1):
                self._floor[sender] = old

    def __len__(self) -> int:
        return sum(len(seen) for seen in self._table.values())

    # ---- checkpoints: the table is part of the shard's state -------------------------------------
    def dump(self) -> list:
        """A JSON-able copy, oldest sender first: [[sender, [[rid, reply], ...]], ...], with the
        sender's floor as a third item once its window has let any rid go."""
        return [[s, [[rid, r] for rid, r in seen.items()]]
                + ([self._floor[s]] if s in self._floor else [])
                for s, seen in self._table.items()]

    @classmethod
    def load(cls, data: list, window: int = 64, senders: int = 1024) -> "DedupTable":
        """The inverse of dump (a dump from before floors, [sender, entries], reads too)."""
        table = cls(window, senders)
        for sender, entries, *floor in data or []:
            for rid, reply in entries:
                table.remember(str(sender), int(rid), reply)
            if floor and int(floor[0]) > table._floor.get(str(sender), -1):
                table._floor[str(sender)] = int(floor[0])
        return table
