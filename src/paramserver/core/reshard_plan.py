"""Where key ranges go when a server joins or leaves a running job (live resharding).

Shards hold contiguous key ranges in rank order, so a change of server count is a new list of
cuts plus a choice of which server takes which range. The cuts balance a per-key cost that is
half bytes (every key has the job's one dtype) and half measured load (a shard's busy seconds
spread evenly over its keys): a shard that was busy gives away more keys than an idle one of
the same size. Of the placements that keep the surviving servers in key order, the one that
moves the fewest keys wins: a join goes in beside the keys it takes, a drain's keys go to its
neighbours.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from paramserver.core.keyspace import SNAP_SLACK, KeyRange


@dataclass(frozen=True)
class Move:
    """Keys `keys` go from the server of old rank `src` to the server of new rank `dst`."""

    src: int
    dst: int
    keys: KeyRange


@dataclass(frozen=True)
class ReshardPlan:
    """The ranges before (by old rank) and after (by new rank), and for each new rank the old
    rank of the server that holds it (None: the joining server)."""

    old: tuple[KeyRange, ...]
    new: tuple[KeyRange, ...]
    owners: tuple[int | None, ...]

    def __post_init__(self) -> None:
        for name, ranges in (("old", self.old), ("new", self.new)):
            if not ranges or ranges[0].lo != 0 or any(
                    a.hi != b.lo for a, b in zip(ranges, ranges[1:])):
                raise ValueError(f"{name} ranges are not contiguous from key 0: {ranges}")
        if self.old[-1].hi != self.new[-1].hi:
            raise ValueError(f"old ranges end at {self.old[-1].hi}, new at {self.new[-1].hi}")
        if len(self.owners) != len(self.new):
            raise ValueError("one owner per new range")
        kept = [o for o in self.owners if o is not None]
        if kept != sorted(set(kept)) or any(not 0 <= o < len(self.old) for o in kept):
            raise ValueError(f"owners {self.owners} do not keep the old servers' order")

    @property
    def moves(self) -> list[Move]:
        """Every key that changes server, as (old rank, new rank, keys), in key order."""
        out = []
        for dst, (r, owner) in enumerate(zip(self.new, self.owners)):
            for src, held in enumerate(self.old):
                if src == owner:
                    continue
                part = held.intersect(r)
                if part is not None:
                    out.append(Move(src, dst, part))
        return out

    @property
    def moved_keys(self) -> int:
        return sum(m.keys.size for m in self.moves)

    @property
    def drained(self) -> list[int]:
        """Old ranks that hold nothing afterwards."""
        return sorted(set(range(len(self.old))) - {o for o in self.owners if o is not None})


def _costs(old: tuple[KeyRange, ...], busy) -> list[float]:
    """Each old range's share of the total cost: half its share of the keys, half its share
    of the busy time (bytes only when nothing was measured)."""
    num_keys = old[-1].hi
    total = float(sum(max(float(b), 0.0) for b in busy)) if busy is not None else 0.0
    out = []
    for i, r in enumerate(old):
        by_bytes = r.size / num_keys
        out.append(by_bytes if total <= 0 else 0.5 * by_bytes + 0.5 * max(float(busy[i]), 0.0)
                   / total)
    return out


def weighted_cuts(old: tuple[KeyRange, ...], busy, count: int, edges=(),
                  slack: float = SNAP_SLACK) -> tuple[KeyRange, ...]:
    """`count` contiguous ranges of equal cost (see the module's note), each cut moved to the
    nearest layer edge within `slack` x the mean range size, every range at least one key."""
    num_keys = old[-1].hi
    if count < 1 or count > num_keys:
        raise ValueError(f"{num_keys} keys cannot be spread over {count} shards")
    costs = _costs(old, busy)
    # The cost up to each old range's end, to invert the piecewise linear cumulative cost.
    ends, acc = [], 0.0
    for c in costs:
        acc += c
        ends.append(acc)
    edges = sorted(e for e in edges if 0 < e < num_keys)
    room = slack * num_keys / count
    cuts, lo = [], 0
    for j in range(1, count):
        target = ends[-1] * j / count
        i = min(bisect.bisect_left(ends, target), len(old) - 1)
        before = ends[i] - costs[i]
        r = old[i]
        frac = (target - before) / costs[i] if costs[i] > 0 else 0.0
        cut = r.lo + round(frac * r.size)
        near = [e for e in edges[max(bisect.bisect_left(edges, cut) - 1, 0):
                                 bisect.bisect_left(edges, cut) + 1] if abs(e - cut) <= room]
        if near:
            cut = min(near, key=lambda e: (abs(e - cut), e))
        cut = min(max(cut, lo + 1), num_keys - (count - j))  # room for one key each
        cuts.append(cut)
        lo = cut
    bounds = [0, *cuts, num_keys]
    return tuple(KeyRange(a, b) for a, b in zip(bounds, bounds[1:]))


def plan_join(old, busy=None, edges=()) -> ReshardPlan:
    """One more server: balanced cuts, the joiner at the place in key order that moves the
    fewest keys (ties: the lowest rank)."""
    old = tuple(old)
    new = weighted_cuts(old, busy, len(old) + 1, edges)
    best = None
    for at in range(len(old) + 1):
        owners = tuple([*range(at), None, *range(at, len(old))])
        plan = ReshardPlan(old, new, owners)
        if best is None or plan.moved_keys < best.moved_keys:
            best = plan
    return best


def plan_drain(old, drained: int, busy=None, edges=()) -> ReshardPlan:
    """Old rank `drained` leaves: balanced cuts over the others, in their order."""
    old = tuple(old)
    if len(old) < 2:
        raise ValueError("the last server cannot be drained")
    if not 0 <= drained < len(old):
        raise ValueError(f"no server rank {drained}: ranks are 0..{len(old) - 1}")
    new = weighted_cuts(old, busy, len(old) - 1, edges)
    owners = tuple(r for r in range(len(old)) if r != drained)
    return ReshardPlan(old, new, owners)
