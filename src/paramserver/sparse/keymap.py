"""A key -> slot map for 64-bit keys: numpy open addressing with linear probing, vectorized.

Any int64 is a valid key, so emptiness lives in the value array: EMPTY (-1) ends a probe
chain, DELETED (-2) is a tombstone that a lookup walks past and an insert may reuse. The
index keeps live + tombstones <= MAX_LOAD of its size and rebuilds itself (tombstones
dropped, size chosen from the live count) when an insert would pass that, so its memory is
bounded by the number of live keys, not by how many keys ever passed through.

Lookups and inserts take whole batches: each probe step is a handful of numpy operations
over the keys still unresolved, and the batch is done when every chain has ended.
"""
import numpy as np

from paramserver.sparse.mix import SALT_INDEX, as_u64, mix64

EMPTY = -1
DELETED = -2
MAX_LOAD = 0.5      # live + tombstones, as a fraction of the index size
REBUILD_LOAD = 0.375  # the most live keys a rebuilt index starts with
MIN_SIZE = 1024
MAX_SIZE = 1 << 31  # values are int32


def index_size_for(live: int) -> int:
    """The index size (a power of two) a rebuild picks for `live` keys: load <= REBUILD_LOAD,
    leaving room for at least a third as many again (new keys or tombstones) before the next
    rebuild. Bytes per live key: 12 / load, so between 24 and 64."""
    need = max(MIN_SIZE, int(live / REBUILD_LOAD) + 1)
    return min(MAX_SIZE, 1 << (need - 1).bit_length())


class KeyIndex:
    """int64 key -> int32 value (>= 0), batch calls; keys unique within an insert."""

    def __init__(self, size: int = MIN_SIZE):
        self._alloc(index_size_for(0) if size <= MIN_SIZE else size)

    def _alloc(self, size: int) -> None:
        assert size & (size - 1) == 0
        self.size = size
        self.mask = np.uint64(size - 1)
        self.keys = np.zeros(size, np.int64)
        self.vals = np.full(size, EMPTY, np.int32)
        self.live = 0
        self.deleted = 0

    def __len__(self) -> int:
        return self.live

    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return (mix64(as_u64(keys) ^ SALT_INDEX) & self.mask).astype(np.int64)

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values, positions) of each key: -1 and -1 where the key is absent. Duplicates ok."""
        n = len(keys)
        vals = np.full(n, -1, np.int64)
        where = np.full(n, -1, np.int64)
        pos = self._home(keys)
        todo = np.arange(n)
        want = keys
        size = self.size
        while todo.size:
            v = self.vals[pos]
            hit = (v >= 0) & (self.keys[pos] == want)
            if hit.any():
                vals[todo[hit]] = v[hit]
                where[todo[hit]] = pos[hit]
            more = ~hit & (v != EMPTY)
            todo, pos, want = todo[more], pos[more] + 1, want[more]
            pos[pos == size] = 0
        return vals, where

    def get(self, keys: np.ndarray) -> np.ndarray:
        return self.find(keys)[0]

    def insert(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Add keys known to be absent (unique) with their values (>= 0)."""
        n = len(keys)
        if n == 0:
            return
        if self.live + self.deleted + n > MAX_LOAD * self.size:
            self.rebuild(self.live + n)
        self._place(keys, values)

    def _place(self, keys: np.ndarray, values: np.ndarray) -> None:
        pos = self._home(keys)
        todo = np.arange(len(keys))
        size = self.size
        while todo.size:
            v = self.vals[pos]
            free = v < 0
            if free.any():
                fpos, fkeys = pos[free], keys[todo[free]]
                # Several keys may reach the same free position in one step: the keys array
                # ends with one of them, which claims it; the others probe on.
                self.keys[fpos] = fkeys
                won = self.keys[fpos] == fkeys
                wpos = fpos[won]
                self.deleted -= int(np.count_nonzero(v[free][won] == DELETED))
                self.vals[wpos] = values[todo[free][won]]
                claimed = np.zeros(len(todo), bool)
                claimed[np.flatnonzero(free)[won]] = True
                more = ~claimed
            else:
                more = np.ones(len(todo), bool)
            todo, pos = todo[more], pos[more] + 1
            pos[pos == size] = 0
        self.live += len(keys)

    def remove_at(self, positions: np.ndarray) -> None:
        """Delete the keys at these positions (from `find`; unique, all live)."""
        self.vals[positions] = DELETED
        self.live -= len(positions)
        self.deleted += len(positions)

    def rebuild(self, live_after: int) -> None:
        """Re-place the live keys in an index sized for `live_after` keys, tombstones gone."""
        occupied = self.vals >= 0
        keys, vals = self.keys[occupied], self.vals[occupied]
        self._alloc(index_size_for(live_after))
        self._place(keys, vals)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        occupied = self.vals >= 0
        return self.keys[occupied], self.vals[occupied]
