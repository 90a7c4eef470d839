"""The coordinator's recent metrics records, for observers (`paramserver top ADDRESS`).

A bounded ring: the coordinator puts in every record it appends to metrics.jsonl, numbered
from 1; an observer asks for those after the last number it saw and gets at most what one reply
header can hold. Records older than the ring are gone (the file has them).
"""

from __future__ import annotations

from collections import deque

# A reply's header is at most 64 KB (wire.codec.MAX_HEADER_BYTES): the records of one reply
# stay under this bound, which leaves room for the members' summary.
REPLY_BUDGET = 40_000


def packed_size(record: dict) -> int:
    """An upper bound of the record's msgpack size as a metrics line (with its `t`): a string
    costs its UTF-8 bytes and a header of at most 3 bytes (a record's strings are at most 256
    characters: wire RECORD), a number at most 9 bytes."""
    size = 5 + 11  # the map's header, and "t" with a float
    for k, v in record.items():
        size += len(str(k).encode()) + 3
        size += len(v.encode()) + 3 if isinstance(v, str) else 9
    return size


class RecentRecords:
    """The last `capacity` metrics records with their sequence numbers."""

    def __init__(self, capacity: int = 4096):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.ring: deque = deque(maxlen=capacity)  # (t, record), oldest first
        self.seq = 0  # the number of the newest record

    def add(self, t: float, record: dict) -> None:
        """One record appended at `t` (the line's time); costs a deque append, nothing is
        copied or formatted until an observer asks."""
        self.ring.append((t, record))
        self.seq += 1

    def since(self, seq: int, limit: int = 512,
              budget: int = REPLY_BUDGET) -> tuple[int, list[dict], bool]:
        """(the number of the last record returned, the records after `seq` as metrics lines,
        whether more are waiting). A `seq` beyond the newest (a restarted coordinator) starts
        over from the oldest kept."""
        if seq > self.seq or seq < 0:
            seq = 0
        first = self.seq - len(self.ring) + 1  # the number of the oldest kept
        start = max(seq + 1, first)
        out: list[dict] = []
        spent = 0
        n = start
        for i in range(start - first, len(self.ring)):
            t, record = self.ring[i]
            cost = packed_size(record)
            if out and (len(out) >= limit or spent + cost > budget):
                break
            out.append({"t": round(t, 6), **record})
            spent += cost
            n += 1
        return n - 1 if out else max(seq, first - 1), out, n <= self.seq
