"""A piece of an epoch's sample order: what an elastic job's coordinator lends with each release
(coordinator/ledger.py) and the worker's sampler draws from (data/ledger_sampler.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """Positions [lo, hi) of epoch `epoch`'s permutation."""

    epoch: int
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def to_wire(self) -> list[int]:
        return [self.epoch, self.lo, self.hi]

    @classmethod
    def from_wire(cls, item) -> "Piece":
        if (not isinstance(item, (list, tuple)) or len(item) != 3
                or not all(isinstance(v, int) and v >= 0 for v in item) or item[1] > item[2]):
            raise ValueError(f"a sample piece is [epoch, lo, hi] with 0 <= lo <= hi, got {item!r}")
        return cls(*item)
