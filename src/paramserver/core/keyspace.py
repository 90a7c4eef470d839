"""The flat key space: contiguous key ranges and their balanced split across server shards."""

from __future__ import annotations

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
