"""A dead coordinator's events.jsonl folded, record by record, into one thing the coordinator
restarted in its place needs (replica_history.py: its backups and shard map; worker_history.py:
its workers). Pure: the node reads the file and hands the records over."""

from __future__ import annotations

from typing import ClassVar


class LogFold:
    """A fold over the records of events.jsonl, in order; only the events in `kinds` reach
    `_take` (others, and records that are not dicts, are skipped)."""

    kinds: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def of(cls, records):
        fold = cls()
        for r in records:
            if isinstance(r, dict) and r.get("event") in cls.kinds:
                fold._take(r)
        return fold

    def _take(self, r: dict) -> None:
        raise NotImplementedError
