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
batch, not once per probe; the few chains that go on are read WIDE positions a step. A
lookup compares the windows with (key, EMPTY) pairs in one flat pass: the first position of
a chain holding the key decides (live, or a tombstone: absent), since an insert takes the
first free position of its chain, so a live entry is never behind a tombstone of its own key
nor behind an EMPTY (whose key is never read: it may be anything). Chains do not wrap
around: keys hash to [0, size) and the arrays run on for PAD more positions, whose last
WINDOW are kept EMPTY so every chain ends inside the arrays; an insert that would pass them
rebuilds the index twice as large. Rebuilds place all keys at once in home order (see
`_build`).
"""
import numpy as np

from paramserver.sparse.mix import SALT_INDEX, as_u64, mix64

EMPTY = -1
DELETED = -2
MAX_LOAD = 0.5      # live + tombstones, as a fraction of the index size
REBUILD_LOAD = 0.375  # the most live keys a rebuilt index starts with
MIN_SIZE = 1024
MAX_SIZE = 1 << 31  # values are int32
WINDOW = 4          # positions a step reads per key (the packing below assumes 4)
WIDE = 16           # positions a step reads per key for the few chains that go on
SCALAR_TAIL = 32    # an insert places its last this many keys one by one
PAD = 256           # positions past the hashed range
SLOT_BYTES = 16     # a key and its value

# A step compares a window's WINDOW (key, value) pairs as 2 * WINDOW int64 in one flat pass
# and reads each window's bools as one uint64: key columns are bytes 0, 2, 4, 6, value
# columns bytes 1, 3, 5, 7.
_PAIR = np.dtype(f"V{SLOT_BYTES}")
_WIN = np.dtype(f"V{SLOT_BYTES * WINDOW}")
_KEY_COLS = np.uint64(0x0001000100010001 if np.little_endian else 0x0100010001000100)
# (packed key columns b0..b3, each 0 or 1) * _GATHER >> 60 == b0 << 3 | b1 << 2 | b2 << 1 | b3
# (bits 0, 16, 32, 48 go to 63, 62, 61, 60; every other product lands below bit 60, each on
# a bit of its own so nothing carries, or past bit 63); _FIRST maps that nibble to the index
# of the first set column.
_GATHER = np.uint64(1 << 63 | 1 << 46 | 1 << 29 | 1 << 12)
_FIRST = np.array([0 if m & 8 else 1 if m & 4 else 2 if m & 2 else 3 for m in range(16)],
                  np.int64)


def _value_cols(packed: np.ndarray) -> np.ndarray:
    """Packed windows with each value column moved onto its key column, the rest cleared."""
    moved = packed >> np.uint64(8) if np.little_endian else packed << np.uint64(8)
    moved &= _KEY_COLS
    return moved


def _first(packed: np.ndarray, flat: np.ndarray, rows: np.ndarray | None,
           col: int = 0) -> np.ndarray:
    """Index of the first key column set in each packed window of `packed` (key columns
    only; junk in 0..WINDOW-1 where none is): windows `rows` (None: all) of the flat bools
    `flat`, whose column `col` (0 key, 1 value) `packed` holds."""
    if np.little_endian:
        return _FIRST[((packed * _GATHER) >> np.uint64(60)).view(np.int64)]
    windows = flat.reshape(-1, 2 * WINDOW)
    return (windows if rows is None else windows[rows])[:, col::2].argmax(axis=1)


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
        self.pairs = np.full(2 * n, EMPTY, np.int64)   # the key of an EMPTY is never read
        self.keys = self.pairs[0::2]
        self.vals = self.pairs[1::2]
        # Item i: the WINDOW (key, value) pairs from position i on, as one byte string.
        self._win = np.ndarray(shape=(n - WINDOW + 1,), dtype=_WIN, buffer=self.pairs,
                               strides=(SLOT_BYTES,))
        self._wide = np.ndarray(shape=(n - WIDE + 1,), dtype=f"V{SLOT_BYTES * WIDE}",
                                buffer=self.pairs, strides=(SLOT_BYTES,))
        self.live = 0
        self.deleted = 0

    def __len__(self) -> int:
        return self.live

    def nbytes(self) -> int:
        return self.pairs.nbytes

    def _home(self, keys: np.ndarray) -> np.ndarray:
        h = mix64(as_u64(keys) ^ SALT_INDEX, inplace=True)
        h &= self.mask
        return h.view(np.int64)                 # < size <= 2^31

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values, positions) of each key: -1 and -1 where the key is absent. Duplicates ok."""
        n = len(keys)
        start = self._home(keys)
        # Each window compared with (key, EMPTY) WINDOW times over, in one flat pass: a True in
        # a key column is the key (live or a tombstone: the first one decides), in a value
        # column an EMPTY; either ends the search there.
        q = np.empty((n, 2), np.int64)
        q[:, 0] = keys
        q[:, 1] = EMPTY
        pattern = np.repeat(q.view(_PAIR)[:, 0], WINDOW).view(_WIN)
        eq = self._win[start].view(np.int64) == pattern.view(np.int64)
        packed = eq.view(np.uint64)
        match = packed & _KEY_COLS
        # Whole-batch passes for the first window, where nearly every search ends (a window
        # without the key reads a junk position of it, and is not taken).
        pos = start + _first(match, eq, None)
        vals = self.vals[pos]
        found = vals >= 0
        found &= match != 0
        np.copyto(vals, -1, where=~found)
        where = np.where(found, pos, -1)
        more = (packed == 0).nonzero()[0]
        if len(more):
            self._find_rest(keys, start, more, vals, where)
        return vals, where

    def _find_rest(self, keys, start, todo, vals, where) -> None:
        """Go on with the searches `todo` whose first window held neither key nor EMPTY (a
        few), a WIDE window at a time, filling in vals and where."""
        last = len(self._wide) - 1
        start = start[todo] + WINDOW
        while len(todo):
            # A window is moved back to stay inside the arrays: what it then reads again is
            # of the same chain, and held neither key nor EMPTY.
            at_least = np.minimum(start, last)
            w = self._wide[at_least].view(np.int64).reshape(len(todo), WIDE, 2)
            hit = w[:, :, 0] == keys[todo, None]
            has = hit.any(axis=1)
            col = hit.argmax(axis=1)
            r = has.nonzero()[0]
            v = w[r, col[r], 1]
            ok = v >= 0
            at = todo[r[ok]]
            vals[at] = v[ok]
            where[at] = at_least[r[ok]] + col[r[ok]]
            ended = has | (w[:, :, 1] == EMPTY).any(axis=1)
            todo, start = todo[~ended], start[~ended] + WIDE

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
            # Sorted (home, i) pairs packed in one int64 (both < 2^31): a plain sort, several
            # times faster than an argsort, gives the order (ties by i) and the sorted homes.
            by_home = self._home_for(keys, size) << 32
            by_home |= steps
            by_home.sort()
            order = by_home & 0xFFFFFFFF
            by_home >>= 32
            by_home -= steps
            pos = np.maximum.accumulate(by_home, out=by_home)
            pos += steps
            if not len(pos) or pos[-1] < size + PAD - WINDOW or size >= MAX_SIZE:
                break
            size *= 2
        self._alloc(size)
        pairs = np.empty((len(keys), 2), np.int64)
        pairs[:, 0] = keys
        pairs[:, 1] = values
        self.pairs.view(_PAIR)[pos] = pairs.view(_PAIR)[order, 0]
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
            if len(todo) <= SCALAR_TAIL:
                return self._place_each(keys, values, todo, pos, last)
            neg = self._win[pos].view(np.int64) < 0
            free = _value_cols(neg.view(np.uint64))
            has = free != 0
            r = has.nonzero()[0]
            at = pos[r] + _first(free[r], neg, r, 1)
            if (at >= last).any():
                return todo     # every key not placed yet, not only those that ran over
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

    def _place_each(self, keys, values, todo: np.ndarray, pos: np.ndarray,
                    last: int) -> np.ndarray:
        """_place's last few keys one by one, each from its position `pos` on (a step of
        numpy calls per key costs more than walking its chain in Python)."""
        vals, k = self.vals, self.keys
        for i, (t, p) in enumerate(zip(todo.tolist(), pos.tolist())):
            while vals[p] >= 0:
                p += 1
            if p >= last:
                return todo[i:]
            if vals[p] == DELETED:
                self.deleted -= 1
            k[p] = keys[t]
            vals[p] = values[t]
            self.live += 1
        return todo[:0]

    def remove_at(self, positions: np.ndarray) -> None:
        """Delete the keys at these positions (from `find`; unique, all live)."""
        self.vals[positions] = DELETED
        self.live -= len(positions)
        self.deleted += len(positions)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, values) of the live entries, in position order."""
        live = np.compress(self.vals >= 0, self.pairs.reshape(-1, 2), axis=0)
        return live[:, 0], live[:, 1]
