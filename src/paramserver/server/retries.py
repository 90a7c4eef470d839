"""A shard's exactly-once rule for pushes, as a part of ShardCore: the dedup table of the
pushes applied (by sender and request id) and what it refused. A retry of a push applied here
is answered with the ack it got, never applied twice; a retry below what the table let go of
may have been applied, so it is refused (the pusher hears why); a fresh push beyond its
sender's unacknowledged depth is refused too. Pure."""

from __future__ import annotations

from paramserver.server.dedup import FORGOTTEN, DedupError, DedupTable
from paramserver.server.store import StoreError


class RetryGuard:
    def __init__(self, depth: int):
        self.table = DedupTable(depth=depth)
        self.duplicates = 0  # retried pushes answered from the table
        self.refused_retries = 0  # retries the table cannot prove fresh
        self.refused_pushes = 0  # pushes beyond a sender's unacknowledged depth

    def applied_before(self, ev) -> dict | None:
        """The ack a retried push got the first time, or None for a push never applied (and
        now admitted). StoreError for a retry below what the table let go of, or a fresh push
        beyond its sender's depth: refused and counted, never applied."""
        done = self.retried(ev)
        if done is None:
            self.admit(ev)
        return done

    def retried(self, ev) -> dict | None:
        """The ack a retried push got the first time; None for a push never applied."""
        done = self.table.lookup(ev.sender, ev.rid, ev.mark)
        if done is FORGOTTEN:
            self.refused_retries += 1
            raise StoreError(f"request {ev.rid} from {ev.sender} is older than what this shard "
                             f"remembers of it: it may have been applied already, so it is "
                             f"refused rather than applied twice")
        if done is not None:
            self.duplicates += 1
        return done

    def admit(self, ev) -> None:
        """Refuse (and count) a fresh push beyond its sender's unacknowledged depth."""
        try:
            self.table.admit(ev.sender, ev.rid)
        except DedupError as exc:
            self.refused_pushes += 1
            raise StoreError(str(exc)) from None

    def applied(self, ev, ack: dict) -> None:
        """Push `ev` was applied and answered `ack`: its retries get the same."""
        self.table.remember(ev.sender, ev.rid, ack, ev.mark)

    def dump(self) -> list:
        """The table for a checkpoint or a backup's sync."""
        return self.table.dump()

    def load(self, dumped) -> None:
        """The table of a checkpoint or a primary's sync: those pushes stay applied once."""
        t = self.table
        self.table = DedupTable.load(dumped, t.window, t.senders, t.depth)

    def counters(self) -> dict:
        return {"duplicates": self.duplicates, "refused_retries": self.refused_retries,
                "refused_pushes": self.refused_pushes}
