"""When the coordinator checkpoints, and the bookkeeping of one checkpoint in flight."""

from __future__ import annotations

import time
from pathlib import Path

from paramserver.runlog.checkpoint import commit, read_part, write_part

COORDINATOR_PART = "coordinator"


class CheckpointKeeper:
    """Every `every` rounds (round mode) or worker steps (arrival mode), or `seconds`.

    A checkpoint goes: the coordinator asks every server to save its shard under a tag; each
    answers `saved`; when all have, the coordinator writes its own part and commits the tag.
    Only one checkpoint is in flight; a due one is skipped while another is being written.
    """

    def __init__(self, root: str | Path | None, every: int | None = None,
                 seconds: float | None = None):
        self.root = Path(root) if root else None
        self.every, self.seconds = every, seconds
        self.last_count, self.last_time = 0, time.monotonic()
        self.pending_tag: str | None = None
        self.waiting: set[int] = set()
        self.committed: list[str] = []

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def due(self, count: int) -> bool:
        if not self.enabled or self.pending_tag is not None:
            return False
        by_count = self.every and count - self.last_count >= self.every
        by_time = self.seconds and time.monotonic() - self.last_time >= self.seconds
        return bool(by_count or by_time)

    def begin(self, tag: str, server_ranks: list[int], count: int) -> None:
        self.pending_tag, self.waiting = tag, set(server_ranks)
        self.last_count, self.last_time = count, time.monotonic()

    def saved(self, rank: int, tag: str) -> bool:
        """Note a server's confirmation; True when the pending checkpoint's shards are all in."""
        if tag != self.pending_tag:
            return False
        self.waiting.discard(rank)
        return not self.waiting

    def abort(self) -> None:
        """Give up the pending checkpoint (a server died before saving): the next one is due
        on the usual schedule; the previous committed one stays the latest."""
        self.pending_tag, self.waiting = None, set()

    def complete(self, state: dict) -> str:
        """Write the coordinator's part and commit the pending tag; returns it."""
        tag, self.pending_tag = self.pending_tag, None
        write_part(self.root, tag, COORDINATOR_PART, {}, state)
        commit(self.root, tag)
        self.committed.append(tag)
        return tag


def load_coordinator_state(root: str | Path, tag: str) -> dict:
    """The coordinator's saved state of checkpoint `tag` (checksums verified)."""
    _, meta = read_part(Path(root), tag, COORDINATOR_PART)
    return meta
