"""Which shard map a client follows while servers join and leave (live resharding).

A job started with `--servers MIN:MAX` moves key ranges between servers while it runs; each
move is a new shard map, numbered by the coordinator's `epoch`. A client hears of maps from
three places (a release, a heartbeat answer, a server's `moved` refusal), in any order and
more than once: `LayoutFollower` keeps the newest one it has not switched to yet, and the
client switches at a quiet point (no request in flight). Pure: no sockets, clock or threads.
"""

from __future__ import annotations

from typing import Any

from paramserver.spec.welcome import ShardLayout


class LayoutFollower:
    """The epoch a client follows and the newest map it was told of and has not switched to:
    a newer epoch wins, an older or equal one is ignored (it comes late, or twice)."""

    def __init__(self, epoch: int, num_keys: int):
        self.epoch = int(epoch)
        self.num_keys = int(num_keys)
        self.pending: ShardLayout | None = None

    def offer(self, epoch: Any, layout: Any) -> bool:
        """A map heard of; True if it is newer than any known (it is then pending). A map
        that does not parse raises ValueError (the caller says who sent it)."""
        if epoch is None or layout is None:
            return False
        newest = self.epoch if self.pending is None else self.pending.epoch
        if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch <= newest:
            return False
        self.pending = ShardLayout.parse(epoch, layout, self.num_keys)
        return True

    @property
    def behind(self) -> bool:
        """A newer map is known than the one followed."""
        return self.pending is not None

    def take(self) -> ShardLayout | None:
        """The pending map, now followed (None when there is none)."""
        layout, self.pending = self.pending, None
        if layout is not None:
            self.epoch = layout.epoch
        return layout
