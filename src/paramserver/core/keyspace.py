"""The flat key space: contiguous key ranges and their balanced split across server shards."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class KeyRange:
    """Half-open range [lo, hi) of keys; a key addresses one scalar of the flat parameter vector."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (0 <= self.lo <= self.hi):
            raise ValueError(f"bad key range [{self.lo}, {self.hi})")

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def intersect(self, other: "KeyRange") -> "KeyRange | None":
        lo, hi = max(self.lo, other.lo), min(self.hi, other.hi)
        return KeyRange(lo, hi) if lo < hi else None

    def contains(self, other: "KeyRange") -> bool:
        return self.lo <= other.lo and other.hi <= self.hi


def split_balanced(num_keys: int, num_shards: int) -> list[KeyRange]:
    """Split [0, num_keys) into num_shards contiguous ranges whose sizes differ by at most one."""
    if num_shards < 1:
        raise ValueError("need at least one shard")
    if num_keys < num_shards:
        raise ValueError(f"{num_keys} keys cannot be spread over {num_shards} shards")
    base, extra = divmod(num_keys, num_shards)
    ranges, lo = [], 0
    for rank in range(num_shards):
        hi = lo + base + (1 if rank < extra else 0)
        ranges.append(KeyRange(lo, hi))
        lo = hi
    return ranges


# A cut between shards moves to a layer's edge when that changes a shard's size by at most this
# fraction of the balanced size: a layer stays whole on one shard (its per-layer requests go to
# one server) unless keeping it whole would unbalance the shards' bytes.
SNAP_SLACK = 0.05


def split_by_bytes(num_keys: int, num_shards: int, edges=(), slack: float = SNAP_SLACK
                   ) -> list[KeyRange]:
    """split_balanced (every key has the job's one dtype, so keys balance bytes), with each
    cut moved to the nearest of `edges` (keys where a layer starts) within `slack` x the
    balanced size; a layer larger than that is cut where the balance says."""
    ranges = split_balanced(num_keys, num_shards)
    edges = sorted(e for e in edges if 0 < e < num_keys)
    if not edges or num_shards == 1:
        return ranges
    room = slack * num_keys / num_shards
    cuts, lo = [], 0
    for r in ranges[:-1]:
        cut = r.hi
        i = bisect.bisect_left(edges, cut)
        near = [e for e in edges[max(i - 1, 0):i + 1] if abs(e - cut) <= room]
        if near:
            cut = min(near, key=lambda e: (abs(e - cut), e))
        cut = max(cut, lo + 1)  # every shard keeps at least one key
        cuts.append(cut)
        lo = cut
    bounds = [0, *cuts, num_keys]
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        return ranges
    return [KeyRange(a, b) for a, b in zip(bounds, bounds[1:])]

# --servers auto: a shard per SHARD_BYTES of parameters, no more shards than the cores the
# workers leave (a shard is one single-threaded process: one more on a busy core only adds
# switches), and each shard's process overhead must fit beside the model.
SHARD_BYTES = 256 << 20
SHARD_OVERHEAD_BYTES = 200 << 20  # an idle shard process: interpreter, torch, sockets
MAX_AUTO_SERVERS = 64
AUTO_SERVERS = "auto"  # `--servers auto`: resolved once the model's size is known
AUTO_SERVERS_HELP = ("auto: one shard per 256 MB of parameters, at most one per core the "
                     "workers leave free (at least 1, at most 64), fewer if the machine's "
                     "free memory cannot hold each shard's process beside the model")


def auto_servers(param_bytes: int, workers: int, cores: int, free_bytes: int) -> int:
    """The shard count `--servers auto` picks for a model of `param_bytes` trained by
    `workers` workers on a machine with `cores` cores and `free_bytes` of free memory."""
    by_size = max(1, math.ceil(param_bytes / SHARD_BYTES))
    by_cores = max(1, cores - workers)
    # Workers hold params + grads each; shards the params once more (plus state).
    spare = free_bytes - (2 * workers + 1) * param_bytes
    by_memory = max(1, spare // SHARD_OVERHEAD_BYTES)
    return int(min(by_size, by_cores, by_memory, MAX_AUTO_SERVERS))


# ---- runs: sorted, disjoint [lo, hi) pairs of keys, touching ones joined ----------------------
Runs = list  # [(lo, hi), ...] (lists [lo, hi] as the wire carries them read the same)


def union_runs(a: Runs, b: Runs) -> list[tuple[int, int]]:
    """The keys in `a` or `b`, as runs."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted([*map(tuple, a), *map(tuple, b)]):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def subtract_runs(a: Runs, b: Runs) -> list[tuple[int, int]]:
    """The keys in `a` and not in `b`, as runs (both sorted and disjoint)."""
    out: list[tuple[int, int]] = []
    j, n = 0, len(b)
    for lo, hi in a:
        while j < n and b[j][1] <= lo:
            j += 1
        k = j
        while lo < hi and k < n and b[k][0] < hi:
            if b[k][0] > lo:
                out.append((lo, b[k][0]))
            lo = max(lo, b[k][1])
            k += 1
        if lo < hi:
            out.append((lo, hi))
    return out


def clip_runs(runs: Runs, lo: int, hi: int, base: int = 0) -> list[tuple[int, int]]:
    """The parts of sorted, disjoint `runs` inside [lo, hi), less `base` (to a shard's local
    keys, say)."""
    return [(max(a, lo) - base, min(b, hi) - base) for a, b in runs if a < hi and lo < b]
