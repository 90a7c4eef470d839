"""Which shard map a client follows while servers join and leave (live resharding).

A job started with `--servers MIN:MAX` moves key ranges between servers while it runs; each
move is a new shard map, numbered by the coordinator's `epoch`. A client hears of maps from
three places (a release, a heartbeat answer, a server's `moved` refusal), in any order and
more than once: `LayoutFollower` keeps the newest one it has not switched to yet, and the
client switches at a quiet point (no request in flight). Pure: no sockets, clock or threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paramserver.core.keyspace import KeyRange
from paramserver.spec.job import JobSpecError
from paramserver.spec.welcome import ShardAddress


@dataclass(frozen=True)
class ShardLayout:
    """Shard map `epoch`: shard rank r holds the r-th contiguous key range, its server at
    `shards[r].addr`; together they cover [0, num_keys)."""

    epoch: int
    shards: tuple[ShardAddress, ...]

    @property
    def ranges(self) -> list[KeyRange]:
        return [KeyRange(s.lo, s.hi) for s in self.shards]

    @property
    def addrs(self) -> list[str]:
        return [s.addr for s in self.shards]

    @classmethod
    def parse(cls, epoch: Any, layout: Any, num_keys: int) -> "ShardLayout":
        """`layout` as the wire says it, [[rank, addr, lo, hi], ...]; checked (ValueError
        naming what is wrong): ranks 0..S-1 in order, ranges contiguous from 0 to num_keys,
        each address once."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"a shard map's epoch is a non-negative int, got {epoch!r}")
        if not isinstance(layout, (list, tuple)) or not layout:
            raise ValueError(f"shard map {epoch}: a layout is a non-empty list of "
                             f"[rank, addr, lo, hi], got {layout!r}")
        shards = []
        for item in layout:
            if not isinstance(item, (list, tuple)) or len(item) != 4:
                raise ValueError(f"shard map {epoch}: each shard is [rank, addr, lo, hi], "
                                 f"got {item!r}")
            try:
                shards.append(ShardAddress(*item))
            except JobSpecError as exc:
                raise ValueError(f"shard map {epoch}: {exc}") from None
        edge = 0
        for r, s in enumerate(shards):
            if s.rank != r:
                raise ValueError(f"shard map {epoch}: ranks must be 0..{len(shards) - 1} in "
                                 f"order, found rank {s.rank} at position {r}")
            if s.lo != edge:
                raise ValueError(f"shard map {epoch}: shard {r} starts at key {s.lo}, the "
                                 f"previous one ends at {edge} (ranges must be contiguous)")
            edge = s.hi
        if edge != num_keys:
            raise ValueError(f"shard map {epoch}: the ranges end at key {edge}, the job has "
                             f"{num_keys} keys")
        if len({s.addr for s in shards}) != len(shards):
            raise ValueError(f"shard map {epoch}: an address holds two shards: "
                             f"{[s.addr for s in shards]}")
        return cls(epoch, tuple(shards))


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
