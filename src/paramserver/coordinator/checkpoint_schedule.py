"""When the coordinator checkpoints, and the bookkeeping of one checkpoint in flight."""

from __future__ import annotations

from paramserver.coordinator.events import AppendEvent, SaveCoordinatorState, Warn


class CheckpointSchedule:
    """Every `every` rounds (round mode) or worker steps (arrival mode), or `seconds`.

    A checkpoint goes: the coordinator asks every server to save its shard under a tag; each
    answers `saved`; when all have, the coordinator writes its own part and commits the tag.
    Only one checkpoint is in flight; a due one is skipped while another is being written.
    Times are the caller's clock (the events' `now`).
    """

    def __init__(self, root: str | None, every: int | None = None,
                 seconds: float | None = None, now: float = 0.0, latest: str | None = None,
                 keeps_initial: bool = False):
        self.root = root
        # Checkpoint 0: each shard saves its initial values under INITIAL_TAG as soon as it
        # has them, before the coordinator commits that tag (at the start barrier); a server
        # lost before any commit comes back from its own part of it.
        self.keeps_initial = keeps_initial and root is not None
        self.every, self.seconds = every, seconds
        self.last_count, self.last_time = 0, now
        self.pending_tag: str | None = None
        self.waiting: set[int] = set()
        self.state: dict = {}  # the coordinator's counters the pending checkpoint records
        self.latest = latest  # the newest committed tag: a restarted server restores it
        self._before = latest  # the one before `latest`, should `latest` fail to commit

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def due(self, count: int, now: float) -> bool:
        if not self.enabled or self.pending_tag is not None:
            return False
        by_count = self.every and count - self.last_count >= self.every
        by_time = self.seconds and now - self.last_time >= self.seconds
        return bool(by_count or by_time)

    def restart_count(self, count: int, now: float) -> None:
        """The next checkpoint is due `every` (or `seconds`) from here: a rebuilt job's
        progress is not the one the last checkpoint was counted from."""
        self.last_count, self.last_time = count, now

    def begin(self, tag: str, server_ranks: list[int], count: int, now: float,
              state: dict | None = None) -> None:
        """Checkpoint `tag` asked of the servers; `state`: the coordinator's counters as they
        stood when it was asked (its part, written once every shard has saved)."""
        self.pending_tag, self.waiting = tag, set(server_ranks)
        self.state = {} if state is None else state
        self.last_count, self.last_time = count, now

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

    def complete(self) -> str:
        """The pending tag, now complete: the caller writes the coordinator's part and commits
        it (save_coordinator_state)."""
        tag, self.pending_tag = self.pending_tag, None
        self._before, self.latest = self.latest, tag
        return tag

    # ---- the checkpoint part's events (CoordinatorState routes them here) -----------------------
    def shard_saved(self, rank: int, tag: str, failed: str | None, src: str, now: float,
                    out: list) -> None:
        """Shard `rank` saved its part of `tag` (or could not: `failed`). When every shard
        has, the coordinator's part is written and the tag committed (SaveCoordinatorState)."""
        if failed is not None:
            self.unwritten(tag, f"{src}: {failed}", now, out)
            return
        if not self.saved(rank, tag):
            return
        state = self.state
        tag = self.complete()
        out.append(SaveCoordinatorState(tag, state))
        out.append(AppendEvent(now, "checkpoint", {"tag": tag,
                                                   "samples": state["samples_done"]}))

    def unwritten(self, tag: str, reason: str, now: float, out: list) -> None:
        """A part of checkpoint `tag` the disk refused: training goes on, that checkpoint is
        given up (the next is tried on schedule) and the last committed one stays the one a
        restart or resume uses."""
        if self.give_up(tag):
            out.append(Warn(f"checkpoint {tag} given up, training goes on: {reason}"))
            out.append(AppendEvent(now, "checkpoint_failed", {"tag": tag,
                                                              "reason": reason[:500]}))

    def give_up(self, tag: str) -> bool:
        """Checkpoint `tag` could not be written (a shard's part or the coordinator's): not
        pending any more, and not the latest if it had been completed. False when `tag` is
        neither (a second shard's failure of the same one)."""
        if tag == self.pending_tag:
            self.abort()
            return True
        if tag == self.latest:
            self.latest = self._before
            return True
        return False
