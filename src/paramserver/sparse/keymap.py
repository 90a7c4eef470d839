"""A key -> slot map for 64-bit keys: numpy open addressing with linear probing, vectorized.

Any int64 is a valid key, so emptiness lives in the value array: EMPTY (-1) ends a probe
chain, DELETED (-2) is a tombstone that a lookup walks past and an insert may reuse. The
index keeps live + tombstones <= MAX_LOAD of its size and rebuilds itself (tombstones
dropped, size chosen from the live count) when an insert would pass that, so its memory is
bounded by the number of live keys, not by how many keys ever passed through.

Keys and values sit side by side (one int64 pair a position). Lookups and inserts take
whole batches: each step reads a window of WINDOW neighbouring positions for every key still
unresolved as one item of a byte-string view whose items overlap (a 64-byte copy a key, one
or two cache lines, instead of numpy's much slower element or row gathers), so at this load
most chains end in the first step and numpy's per-call overhead is paid a few times per
batch, not once per probe. Chains do not wrap around: keys hash to [0, size) and the arrays
run on for PAD more positions, whose last WINDOW are kept EMPTY so every chain ends inside
the arrays; an insert that would pass them rebuilds the index twice as large. Rebuilds place
all keys at once in home order (see `_build`).
"""
import numpy as np

from paramserver.sparse.mix import SALT_INDEX, as_u64, mix64

EMPTY = -1
DELETED = -2
MAX_LOAD = 0.5      # live + tombstones, as a fraction of the index size
REBUILD_LOAD = 0.375  # the most live keys a rebuilt index starts with
MIN_SIZE = 1024
MAX_SIZE = 1 << 31  # values are int32
WINDOW = 4          # positions a step reads per key (_first_true assumes 4)
PAD = 256           # positions past the hashed range
SLOT_BYTES = 16     # a key and its value
_ROW = np.dtype(f"u{WINDOW}")  # a row of WINDOW bools seen as one unsigned integer


# (bytes b0..b3 of a packed row, each 0 or 1) * _GATHER >> 24 == b0 << 3 | b1 << 2 | b2 << 1 | b3
# (the four products land on bits 27..24, every other product below bit 24 or past bit 31);
# _FIRST maps that nibble to the index of the first set byte.
_GATHER = np.uint32(0x08040201)
_FIRST = np.array([0 if m & 8 else 1 if m & 4 else 2 if m & 2 else 3 for m in range(16)],
                  np.int64)


def _first_true(rows: np.ndarray) -> np.ndarray:
    """Index of the first True in each row of WINDOW (4) bools packed as one little-endian
    uint32 (nonzero)."""
    return _FIRST[(rows * _GATHER) >> np.uint32(24)]


def _first(mask: np.ndarray, packed: np.ndarray, rows: np.ndarray) -> np.ndarray:
    if np.little_endian:
        return _first_true(packed[rows])
    return mask[rows].argmax(axis=1)


def index_size_for(live: int) -> int:
    """The index size (a power of two) a rebuild picks for `live` keys: load <= REBUILD_LOAD,
    leaving room for at least a third as many again (new keys or tombstones) before the next
    rebuild. Bytes per live key: 16 / load, so between 32 and 86 (plus PAD positions)."""
    need = max(MIN_SIZE, int(live / REBUILD_LOAD) + 1)
    return min(MAX_SIZE, 1 << (need - 1).bit_length())


class KeyIndex:
    """int64 key -> int32 value (>= 0), batch calls; keys unique within an insert."""

    def __init__(self, size: int = MIN_SIZE):
        self._alloc(index_size_for(0) if size <= MIN_SIZE else size)

    def _alloc(self, size: int) -> None:
        if size & (size - 1) or size > MAX_SIZE:
            raise ValueError(f"index size must be a power of two <= {MAX_SIZE}, got {size}")
        self.size = size
        self.mask = np.uint64(size - 1)
        n = size + PAD
        self.pairs = np.zeros(2 * n, np.int64)
        self.keys = self.pairs[0::2]
        self.vals = self.pairs[1::2]
        self.vals[:] = EMPTY
        # Item i: the WINDOW (key, value) pairs from position i on, as one byte string.
        self._win = np.ndarray(shape=(n - WINDOW + 1,), dtype=f"V{SLOT_BYTES * WINDOW}",
                               buffer=self.pairs, strides=(SLOT_BYTES,))
        self.live = 0
        self.deleted = 0

    def _read(self, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys, values), each (len(start), WINDOW), at the windows from these positions."""
        w = self._win[start].view(np.int64).reshape(len(start), WINDOW, 2)
        return w[:, :, 0], w[:, :, 1]

    def __len__(self) -> int:
        return self.live

    def nbytes(self) -> int:
        return self.pairs.nbytes

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return (mix64(as_u64(keys) ^ SALT_INDEX) & self.mask).astype(np.int64)

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values, positions) of each key: -1 and -1 where the key is absent. Duplicates ok."""
        n = len(keys)
        vals = np.full(n, -1, np.int64)
        where = np.full(n, -1, np.int64)
        start = self._home(keys)
        todo = None
        want = keys
        while True:
            k, v = self._read(start)
            hit = k == want[:, None]
            hit &= v >= 0
            # WINDOW bools of a row read as one integer: any() and the first True without a
            # reduction over a short axis (slow in numpy).
            hits = hit.view(_ROW)[:, 0]
            found = hits != 0
            if found.any():
                rows = np.flatnonzero(found)
                col = _first(hit, hits, rows)
                at = todo[rows] if todo is not None else rows
                vals[at] = v[rows, col]
                where[at] = start[rows] + col
            # A key is never placed past an EMPTY on its chain: an EMPTY ends the search.
            ended = (v == EMPTY).view(_ROW)[:, 0] != 0
            ended |= found
            if ended.all():
                return vals, where
            more = np.flatnonzero(~ended)
            todo = more if todo is None else todo[more]
            start, want = start[more] + WINDOW, want[more]

    def get(self, keys: np.ndarray) -> np.ndarray:
        return self.find(keys)[0]

    def insert(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Add keys known to be absent (unique) with their values (>= 0)."""
        n = len(keys)
        if n == 0:
            return
        if self.live + self.deleted + n > MAX_LOAD * self.size:
            live_keys, live_vals = self.items()
            self._build(np.concatenate([live_keys, keys]), np.concatenate([live_vals, values]),
                        index_size_for(self.live + n))
            return
        left = self._place(keys, values)
        if len(left):         # a chain ran into the padding: a larger index, all re-placed
            live_keys, live_vals = self.items()
            self._build(np.concatenate([live_keys, keys[left]]),
                        np.concatenate([live_vals, values[left]]), 2 * self.size)

    def _build(self, keys: np.ndarray, values: np.ndarray, size: int) -> None:
        """A fresh index of `size` (or larger) holding exactly these keys.

        Placed in the order of their home positions, key i lands at
        max(home_i, position_{i-1} + 1), which is i + the running maximum of home_j - j: the
        layout linear probing would give, computed in a few whole-array passes instead of
        probing key by key (this is what makes growing the index cheap)."""
        steps = np.arange(len(keys))
        while True:
            homes = self._home_for(keys, size)
            order = np.argsort(homes)
            pos = np.maximum.accumulate(homes[order] - steps) + steps
            if not len(pos) or pos[-1] < size + PAD - WINDOW or size >= MAX_SIZE:
                break
            size *= 2
        self._alloc(size)
        self.keys[pos] = keys[order]
        self.vals[pos] = values[order]
        self.live = len(keys)

    def _home_for(self, keys: np.ndarray, size: int) -> np.ndarray:
        return (mix64(as_u64(keys) ^ SALT_INDEX) & np.uint64(size - 1)).astype(np.int64)

    def _place(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Put each key at the first free position (EMPTY or DELETED) of its chain; the
        indices of the keys that found none before the padding's end (none, nearly always)."""
        pos = self._home(keys)
        todo = np.arange(len(keys))
        last = len(self.vals) - WINDOW          # the first position kept EMPTY
        while len(todo):
            v = self._read(pos)[1]
            free = v < 0
            packed = free.view(_ROW)[:, 0]
            has = packed != 0
            r = np.flatnonzero(has)
            at = pos[r] + _first(free, packed, r)
            over = at >= last
            if over.any():
                return np.concatenate([todo[r[over]], todo[~has]])
            fkeys = keys[todo[r]]
            # Several keys may reach the same free position in one step: the keys array ends
            # with one of them, which claims it; the others go on from there.
            self.keys[at] = fkeys
            won = self.keys[at] == fkeys
            wpos = at[won]
            self.deleted -= int(np.count_nonzero(self.vals[wpos] == DELETED))
            self.vals[wpos] = values[todo[r[won]]]
            self.live += len(wpos)
            nxt = pos + WINDOW
            nxt[r] = at
            more = np.ones(len(todo), bool)
            more[r[won]] = False
            todo, pos = todo[more], nxt[more]
        return todo

    def remove_at(self, positions: np.ndarray) -> None:
        """Delete the keys at these positions (from `find`; unique, all live)."""
        self.vals[positions] = DELETED
        self.live -= len(positions)
        self.deleted += len(positions)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        occupied = self.vals >= 0
        return self.keys[occupied], self.vals[occupied]
