"""One shard's sparse table: rows of a fixed dimension for 64-bit keys, under a row budget.

- Keys (any int64; hashed uint64 ids viewed as int64) map to row slots through a numpy
  open-addressing index (keymap.KeyIndex). Rows live in float32 arrays indexed by slot (made
  at full capacity when they fit in PREALLOCATE_BYTES, pages touched only as slots are used;
  doubled as needed otherwise); evicted slots go to a free stack and are reused.
- Memory is bounded by capacity alone: rows and optimizer state, 3 int64 of bookkeeping and
  at most 86 bytes of index a slot, plus the candidate table and what the last pull left for
  the next push (at most MEMO_KEYS keys and MEMO_BYTES of initial rows; see `nbytes`).
- A key gets a row on its first admitted push, starting at `initial_rows` (seeded by the key),
  so a key that was never pushed, or was evicted, reads the same on every shard and after a
  restore. A pull never creates a row.
- Push: duplicates are summed (in float64, rounded once), multiplied by `scale`, then the
  optimizer runs once per unique key. Adagrad keeps a per-row-per-column accumulator like
  torch.optim.Adagrad (initial accumulator 0, eps 1e-10, no lr decay); SGD keeps nothing.
- Admission: with admit_after = k > 1 a key needs to be in k pushes before it gets a row. The
  counts live in a bounded candidate table (`candidates` keys, default = capacity): exact
  while a key stays in it; when it is full the least recently seen candidates are dropped
  (their counts start again), so its memory never grows with the stream.
- Eviction: when a push would pass `capacity` rows, the rows least recently pushed (lru) or
  least often pushed, older first among equals (lfu), are evicted in a batch of at least
  `evict_fraction` of the capacity, never a row the same push touches.
- Counters add up: created == rows + evicted; per push, every unique key is exactly one of
  updated (had a row), created, dropped (admitted but no room: more new keys in one push than
  the table can free) or not_admitted.

A pull looks each distinct key up once. A push of exactly the keys of the previous pull (a
batch pulled, then its gradients pushed) takes their grouping by key, their slots and the
initial rows of the missing ones from that pull instead of sorting, looking up and making
them again; any push, restore or other pull replaces that.

Pure: no I/O, clock, threads or randomness; the same calls give the same table.
"""
import math
from dataclasses import dataclass

import numpy as np

from paramserver.sparse.init import initial_rows
from paramserver.sparse.groups import KeyGroup, put_rows, rows_of, sum_duplicates, take_rows
from paramserver.sparse.keymap import KeyIndex

MAX_KEYS_PER_REQUEST = 1 << 22
# A shard's checkpoint part holds the arrays of its table `name` (snapshot()'s) as
# SNAPSHOT_PREFIX + name + "." + array; an export reads a table's keys and rows back by it.
SNAPSHOT_PREFIX = "table."
MAX_CAPACITY = (1 << 31) - 1
OPTIMIZERS = ("adagrad", "sgd")
EVICTIONS = ("lru", "lfu")
ADAGRAD_EPS = np.float32(1e-10)
PREALLOCATE_BYTES = 2 << 30
SNAPSHOT_VERSION = 1
MEMO_KEYS = 1 << 16   # the most keys of a pull whose lookups the next push may reuse
MEMO_BYTES = 16 << 20  # and the most bytes of initial rows it may keep for it
COUNTERS = ("rows", "capacity", "created", "admitted", "not_admitted", "dropped", "evicted",
            "updated", "pulls", "pushes", "pulled_keys", "pushed_keys", "candidates")
_NEVER = np.iinfo(np.int64).max
_LFU_TICK_BITS = 40


class TableError(ValueError):
    """Bad input to a sparse table; the table is left as it was."""


@dataclass(frozen=True)
class TableConfig:
    dim: int
    optimizer: str
    lr: float
    init_scale: float
    capacity: int
    admit_after: int
    evict: str
    seed: int
    evict_fraction: float
    candidates: int


def _check_config(c: TableConfig) -> None:
    if not 1 <= c.dim <= 1 << 16:
        raise TableError(f"dim must be in 1..65536, got {c.dim}")
    if c.optimizer not in OPTIMIZERS:
        raise TableError(f"optimizer must be one of {OPTIMIZERS}, got {c.optimizer!r}")
    if not (math.isfinite(c.lr) and c.lr >= 0):
        raise TableError(f"lr must be finite and >= 0, got {c.lr!r}")
    if not (math.isfinite(c.init_scale) and c.init_scale >= 0):
        raise TableError(f"init_scale must be finite and >= 0, got {c.init_scale!r}")
    if not 1 <= c.capacity <= MAX_CAPACITY:
        raise TableError(f"capacity must be in 1..{MAX_CAPACITY}, got {c.capacity}")
    if c.admit_after < 1:
        raise TableError(f"admit_after must be >= 1, got {c.admit_after}")
    if c.evict not in EVICTIONS:
        raise TableError(f"evict must be one of {EVICTIONS}, got {c.evict!r}")
    if not 0 < c.evict_fraction <= 1:
        raise TableError(f"evict_fraction must be in (0, 1], got {c.evict_fraction!r}")
    if not 1 <= c.candidates <= MAX_CAPACITY:
        raise TableError(f"candidates must be in 1..{MAX_CAPACITY}, got {c.candidates}")


def _int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TableError(f"{name} must be an int, got {value!r}")
    return int(value)


def _float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TableError(f"{name} must be a number, got {value!r}")
    return float(value)


def check_keys(keys) -> np.ndarray:
    """`keys` if it is a 1-D int64 array of at most MAX_KEYS_PER_REQUEST keys, else TableError."""
    if not isinstance(keys, np.ndarray):
        raise TableError(f"keys must be a numpy int64 array, got {type(keys).__name__}")
    if keys.dtype != np.int64:
        raise TableError(f"keys must be int64, got {keys.dtype}")
    if keys.ndim != 1:
        raise TableError(f"keys must be 1-D, got shape {keys.shape}")
    if len(keys) > MAX_KEYS_PER_REQUEST:
        raise TableError(f"{len(keys)} keys in one request, the most is {MAX_KEYS_PER_REQUEST}")
    return keys


class SlotPool:
    """Row slots 0..top-1 handed out in a fixed order: freed slots first (last freed first),
    then fresh ones. The order is part of the state, so a restored table reuses slots the
    same way the saved one would have."""

    def __init__(self, top: int = 0, free: np.ndarray | None = None):
        self.top = top
        self.free = np.zeros(0, np.int64) if free is None else free.astype(np.int64)
        self.nfree = len(self.free)

    def used(self) -> int:
        return self.top - self.nfree

    def take(self, k: int) -> np.ndarray:
        reuse = min(k, self.nfree)
        out = np.empty(k, np.int64)
        out[:reuse] = self.free[self.nfree - reuse:self.nfree][::-1]
        self.nfree -= reuse
        out[reuse:] = np.arange(self.top, self.top + k - reuse)
        self.top += k - reuse
        return out

    def give(self, slots: np.ndarray) -> None:
        need = self.nfree + len(slots)
        if need > len(self.free):
            grown = np.empty(max(need, 2 * len(self.free), 64), np.int64)
            grown[:self.nfree] = self.free[:self.nfree]
            self.free = grown
        self.free[self.nfree:need] = slots
        self.nfree = need

    def free_slots(self) -> np.ndarray:
        return self.free[:self.nfree].copy()

    def nbytes(self) -> int:
        return self.free.nbytes


def _grow(a: np.ndarray, n: int) -> np.ndarray:
    """`a` with room for n rows. The new rows are left unwritten (a slot's row, state and
    bookkeeping are all set when the slot is handed out), so their pages cost nothing until
    used."""
    out = np.empty((n,) + a.shape[1:], a.dtype)
    out[:len(a)] = a
    return out


def _pick_victims(score: np.ndarray, pool: SlotPool, keep: np.ndarray, k: int) -> np.ndarray:
    """The k slots of lowest score among used slots not in `keep` (k <= how many there are)."""
    s = score[:pool.top].copy()
    s[pool.free[:pool.nfree]] = _NEVER
    s[keep] = _NEVER
    if k >= len(s):
        return np.flatnonzero(s != _NEVER)
    return np.argpartition(s, k - 1)[:k]


class Candidates:
    """Exact push counts of keys not yet admitted, for at most `limit` keys; when full, the
    least recently seen are forgotten (evict_fraction of the limit at a time)."""

    def __init__(self, limit: int, evict_fraction: float):
        self.limit = limit
        self.batch = max(1, math.ceil(evict_fraction * limit))
        self.index = KeyIndex()
        self.pool = SlotPool()
        self.keys = np.zeros(0, np.int64)
        self.count = np.zeros(0, np.int64)
        self.last = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return self.pool.used()

    def nbytes(self) -> int:
        return (self.index.nbytes() + self.pool.nbytes() + self.keys.nbytes + self.count.nbytes
                + self.last.nbytes)

    def observe(self, keys: np.ndarray, tick: int) -> np.ndarray:
        """Count one more push for each (unique) key; the counts after it."""
        slots = self.index.get(keys)
        seen = slots >= 0
        out = np.ones(len(keys), np.int64)
        old = slots[seen]
        self.count[old] += 1
        self.last[old] = tick
        out[seen] = self.count[old]
        fresh = keys[~seen]
        room = self.limit - len(self)
        if len(fresh) > room:
            k = min(max(len(fresh) - room, self.batch), len(self) - len(old))
            if k > 0:
                self._forget_slots(_pick_victims(self.last, self.pool, old, k))
            room = self.limit - len(self)
        fresh = fresh[:room]     # beyond the limit a key is counted once and not remembered
        if len(fresh):
            new = self.pool.take(len(fresh))
            if self.pool.top > len(self.keys):
                n = min(self.limit, max(self.pool.top, 2 * len(self.keys), 1024))
                self.keys, self.count = _grow(self.keys, n), _grow(self.count, n)
                self.last = _grow(self.last, n)
            self.keys[new], self.count[new], self.last[new] = fresh, 1, tick
            self.index.insert(fresh, new)
        return out

    def forget(self, keys: np.ndarray) -> None:
        """Drop these keys (admitted now) if they are here."""
        slots, where = self.index.find(keys)
        ok = slots >= 0
        self.index.remove_at(where[ok])
        self.pool.give(slots[ok])

    def _forget_slots(self, slots: np.ndarray) -> None:
        _, where = self.index.find(self.keys[slots])
        self.index.remove_at(where)
        self.pool.give(slots)


class SparseTable:
    """Rows for 64-bit keys with per-row optimizer state, bounded by `capacity` rows."""

    def __init__(self, dim: int, *, optimizer: str = "adagrad", lr: float = 0.05,
                 init_scale: float = 0.01, capacity: int = 1_000_000, admit_after: int = 1,
                 evict: str = "lru", seed: int = 0, evict_fraction: float = 0.02,
                 candidates: int | None = None):
        capacity = _int("capacity", capacity)
        cfg = TableConfig(
            dim=_int("dim", dim), optimizer=optimizer, lr=_float("lr", lr),
            init_scale=_float("init_scale", init_scale), capacity=capacity,
            admit_after=_int("admit_after", admit_after), evict=evict, seed=_int("seed", seed),
            evict_fraction=_float("evict_fraction", evict_fraction),
            candidates=capacity if candidates is None else _int("candidates", candidates))
        _check_config(cfg)
        self.config = cfg
        self.dim = cfg.dim
        self._lr = np.float32(cfg.lr)
        self._adagrad = cfg.optimizer == "adagrad"
        self._lfu = cfg.evict == "lfu"
        self._evict_batch = max(1, math.ceil(cfg.evict_fraction * cfg.capacity))
        self._reset()

    @classmethod
    def of(cls, spec, capacity: int, seed: int = 0) -> "SparseTable":
        """A table for a TableSpec-like object (dim, optimizer, lr, init_scale, admit_after,
        evict) holding at most `capacity` rows (this shard's share of the row budget)."""
        return cls(spec.dim, optimizer=spec.optimizer, lr=spec.lr, init_scale=spec.init_scale,
                   capacity=capacity, admit_after=spec.admit_after, evict=spec.evict, seed=seed)

    def _reset(self) -> None:
        self._index = KeyIndex()
        self._pool = SlotPool()
        self._slot_key = np.zeros(0, np.int64)
        self._rows = np.zeros((0, self.dim), np.float32)
        self._accum = np.zeros((0, self.dim), np.float32) if self._adagrad else None
        self._last = np.zeros(0, np.int64)
        self._freq = np.zeros(0, np.int64)
        cfg = self.config
        self._cand = (Candidates(cfg.candidates, cfg.evict_fraction)
                      if cfg.admit_after > 1 else None)
        self._tick = 0
        self._count = dict.fromkeys(COUNTERS, 0)
        self._memo = None

    @property
    def adagrad(self) -> bool:
        """Rows keep Adagrad accumulators (else plain SGD: no per-row state)."""
        return self._adagrad

    # ---- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._pool.used()

    def counters(self) -> dict[str, int]:
        """rows, capacity, created, admitted, not_admitted, dropped, evicted, updated; pulls and
        pushes are calls, pulled_keys and pushed_keys the keys they carried (duplicates
        counted); candidates is how many keys the admission table is counting now."""
        c = dict(self._count)
        c["rows"] = len(self)
        c["capacity"] = self.config.capacity
        c["candidates"] = len(self._cand) if self._cand is not None else 0
        return c

    def nbytes(self) -> int:
        """Bytes of every array the table holds (rows, state, index, bookkeeping)."""
        n = (self._index.nbytes() + self._pool.nbytes() + self._slot_key.nbytes
             + self._rows.nbytes + self._last.nbytes + self._freq.nbytes)
        if self._accum is not None:
            n += self._accum.nbytes
        if self._cand is not None:
            n += self._cand.nbytes()
        if self._memo is not None:
            n += self._memo.nbytes()
        return n

    def initial(self, keys: np.ndarray) -> np.ndarray:
        cfg = self.config
        return initial_rows(keys, cfg.dim, cfg.init_scale, cfg.seed)

    def pull(self, keys: np.ndarray) -> np.ndarray:
        """Rows (n, dim) float32 in the order of `keys`; a key without a row reads as its
        initial row. Creates nothing."""
        keys = check_keys(keys)
        self._memo = None
        self._count["pulls"] += 1
        self._count["pulled_keys"] += len(keys)
        if len(keys) == 0:
            return np.zeros((0, self.dim), np.float32)
        # Each distinct key is looked up (and its initial row made) once.
        group = KeyGroup(keys)
        slots = self._index.get(group.uniq)
        missing = (slots < 0).nonzero()[0]
        if len(missing) == len(slots):
            rows = self.initial(group.uniq)
        else:
            # A missing key's slot -1 reads the last row slot here (any bytes), then its
            # initial row replaces that.
            rows = take_rows(self._rows, slots)
            if len(missing):
                put_rows(rows, missing, self.initial(group.uniq[missing]))
        out = take_rows(rows, group.inverse())
        if len(keys) <= MEMO_KEYS:
            self._memo = _PullMemo(keys.copy(), group, slots,
                                   rows if rows.nbytes <= MEMO_BYTES else None)
        return out

    # ---- writing ---------------------------------------------------------------------------

    def _check_push(self, keys, grads, scale) -> float:
        check_keys(keys)
        if not isinstance(grads, np.ndarray):
            raise TableError(f"grads must be a numpy float32 array, got {type(grads).__name__}")
        if grads.dtype != np.float32:
            raise TableError(f"grads must be float32, got {grads.dtype}")
        if grads.shape != (len(keys), self.dim):
            raise TableError(f"grads must have shape ({len(keys)}, {self.dim}) for "
                             f"{len(keys)} keys, got {grads.shape}")
        scale = _float("scale", scale)
        if not math.isfinite(scale):
            raise TableError(f"scale must be finite, got {scale!r}")
        if not np.isfinite(grads).all():
            raise TableError("grads must be finite (a NaN or inf would poison the rows)")
        return scale

    def push(self, keys: np.ndarray, grads: np.ndarray, scale: float = 1.0) -> None:
        """Sum the grads of duplicate keys, times `scale`, then one optimizer step per unique
        key that has (or now gets) a row; keys not yet admitted are counted, not stored."""
        scale = self._check_push(keys, grads, scale)
        memo, self._memo = self._memo, None
        self._tick += 1
        self._count["pushes"] += 1
        self._count["pushed_keys"] += len(keys)
        if len(keys) == 0:
            return
        if memo is not None and not memo.of(keys):
            memo = None
        group = memo.group if memo is not None else KeyGroup(keys)
        uniq = group.uniq
        g = sum_duplicates(group, np.ascontiguousarray(grads))
        if scale != 1.0:
            g *= np.float32(scale)
        slots = memo.slots.copy() if memo is not None else self._index.get(uniq)
        # The rows the pull read for these keys: what their slots hold now (a new key's
        # slot gets its initial row), so the update need not read them again.
        rows = memo.rows if memo is not None else None
        new = (slots < 0).nonzero()[0]
        self._count["updated"] += len(uniq) - len(new)
        if len(new):
            slots[new] = self._admit(uniq[new], slots[slots >= 0],
                                     take_rows(rows, new) if rows is not None else None)
        touched = slots >= 0
        if not touched.all():
            slots, g = slots[touched], g[touched]
            if rows is not None:
                rows = take_rows(rows, touched.nonzero()[0])
        self._last[slots] = self._tick
        self._freq[slots] += 1
        self._apply(slots, g, rows)

    def _admit(self, keys: np.ndarray, keep: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        """Slots for new keys (-1 for those not admitted or dropped), making room by evicting
        rows not in `keep` (the rows this push updates); `rows`: their initial rows, if
        known."""
        out = np.full(len(keys), -1, np.int64)
        if self._cand is not None:
            counts = self._cand.observe(keys, self._tick)
            ok = counts >= self.config.admit_after
            self._count["not_admitted"] += int(len(keys) - np.count_nonzero(ok))
            idx = np.flatnonzero(ok)
            keys = keys[idx]
            if rows is not None:
                rows = rows[idx]
            self._cand.forget(keys)
        else:
            idx = np.arange(len(keys))
        self._count["admitted"] += len(keys)
        if not len(keys):
            return out
        cap = self.config.capacity
        room = cap - len(self)
        if len(keys) > room:
            k = min(max(len(keys) - room, self._evict_batch), len(self) - len(keep))
            if k > 0:
                self._evict(k, keep)
            room = cap - len(self)
            if len(keys) > room:
                self._count["dropped"] += len(keys) - room
                keys, idx = keys[:room], idx[:room]
                if rows is not None:
                    rows = rows[:room]
        out[idx] = self._create(keys, rows)
        return out

    def _evict(self, k: int, keep: np.ndarray) -> None:
        if self._lfu:
            top = self._pool.top
            score = (np.minimum(self._freq[:top], (1 << (62 - _LFU_TICK_BITS)) - 1)
                     << _LFU_TICK_BITS) | np.minimum(self._last[:top], (1 << _LFU_TICK_BITS) - 1)
        else:
            score = self._last
        victims = _pick_victims(score, self._pool, keep, k)
        _, where = self._index.find(self._slot_key[victims])
        self._index.remove_at(where)
        self._pool.give(victims)
        self._count["evicted"] += len(victims)

    def _create(self, keys: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        slots = self._pool.take(len(keys))
        if self._pool.top > len(self._slot_key):
            self._grow(self._pool.top)
        self._slot_key[slots] = keys
        put_rows(self._rows, slots, self.initial(keys) if rows is None else rows)
        if self._accum is not None:
            rows_of(self._accum)[slots] = rows_of(np.zeros((1, self.dim), np.float32))[0]
        self._last[slots] = self._tick
        self._freq[slots] = 0
        self._index.insert(keys, slots)
        self._count["created"] += len(keys)
        return slots

    def _grow(self, need: int) -> None:
        # Up to PREALLOCATE_BYTES of rows, the arrays are made at full capacity at once: the
        # unwritten part is only address space (no page is touched before its slot is handed
        # out), and no push pays for copying them as they double.
        cap = self.config.capacity
        row_bytes = self._rows.shape[1] * 4 * (2 if self._adagrad else 1) + 24
        if cap * row_bytes <= PREALLOCATE_BYTES:
            n = cap
        else:
            n = min(cap, max(need, 2 * len(self._slot_key), 1024))
        self._slot_key = _grow(self._slot_key, n)
        self._rows = _grow(self._rows, n)
        if self._accum is not None:
            self._accum = _grow(self._accum, n)
        self._last = _grow(self._last, n)
        self._freq = _grow(self._freq, n)

    def _apply(self, slots: np.ndarray, g: np.ndarray, rows: np.ndarray | None = None) -> None:
        """One optimizer step on unique slots with their summed gradients (g is ours; rows,
        if given, ours too: what the slots hold)."""
        if rows is None:
            rows = take_rows(self._rows, slots)
        if self._adagrad:
            acc = take_rows(self._accum, slots)
            sq = np.multiply(g, g)
            acc += sq
            put_rows(self._accum, slots, acc)
            std = np.sqrt(acc, out=sq)
            std += ADAGRAD_EPS
            np.divide(g, std, out=g)
        g *= self._lr
        rows -= g
        put_rows(self._rows, slots, rows)

    # ---- snapshot --------------------------------------------------------------------------

    def config_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The configuration as a snapshot keeps it (ints, floats): a snapshot restores only
        into a table of the same."""
        c = self.config
        ints = [SNAPSHOT_VERSION, c.dim, OPTIMIZERS.index(c.optimizer), c.capacity,
                c.admit_after, EVICTIONS.index(c.evict), c.seed, c.candidates]
        floats = [c.lr, c.init_scale, c.evict_fraction]
        return np.array(ints, np.int64), np.array(floats, np.float64)

    def snapshot(self) -> dict[str, np.ndarray]:
        """Only the rows that exist (by slot), their optimizer state and the bookkeeping that
        decides what happens next (ticks, counts, free slots, admission candidates)."""
        keys, slots = self._index.items()
        order = np.argsort(slots)
        keys, slots = keys[order], slots[order].astype(np.int64)
        meta_i, meta_f = self.config_arrays()
        state = [self._tick, self._pool.top] + [self._count[k] for k in COUNTERS]
        out = {"meta_i": meta_i, "meta_f": meta_f, "state": np.array(state, np.int64),
               "keys": keys, "slots": slots, "rows": self._rows[slots],
               "last": self._last[slots], "freq": self._freq[slots],
               "free": self._pool.free_slots()}
        if self._accum is not None:
            out["accum"] = self._accum[slots]
        if self._cand is not None:
            cand = self._cand
            ck, cs = cand.index.items()
            co = np.argsort(cs)
            ck, cs = ck[co], cs[co].astype(np.int64)
            out.update(cand_keys=ck, cand_slots=cs, cand_count=cand.count[cs],
                       cand_last=cand.last[cs], cand_free=cand.pool.free_slots(),
                       cand_top=np.array([cand.pool.top], np.int64))
        return out

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Make this table equal to the one `snapshot` saved (same configuration required).
        TableError, with the table unchanged, when the arrays do not make a valid table."""
        self._checked(arrays).install(self)

    def check(self, arrays: dict[str, np.ndarray]) -> None:
        """TableError unless `restore(arrays)` would succeed; the table is left alone."""
        self._checked(arrays)

    def _checked(self, arrays) -> "_Restored":
        if not isinstance(arrays, dict):
            raise TableError(f"a snapshot is a dict of arrays, got {type(arrays).__name__}")
        try:
            return _Restored(self, arrays)
        except TableError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise TableError(f"not a valid sparse-table snapshot: {e!r}") from None


class _PullMemo:
    """What a pull found, for a push of the same keys while the table has not changed: the
    keys (a copy), their grouping, the slots of the distinct keys and the rows the pull read
    for them (the initial rows of the missing ones; None when too large to keep)."""

    def __init__(self, keys: np.ndarray, group: KeyGroup, slots: np.ndarray,
                 rows: np.ndarray | None):
        self.keys, self.group, self.slots, self.rows = keys, group, slots, rows

    def of(self, keys: np.ndarray) -> bool:
        return len(keys) == len(self.keys) and np.array_equal(keys, self.keys)

    def nbytes(self) -> int:
        n = self.keys.nbytes + self.group.nbytes() + self.slots.nbytes
        return n + (self.rows.nbytes if self.rows is not None else 0)


def _array(arrays, name: str, dtype, shape: tuple) -> np.ndarray:
    a = arrays[name]
    if not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != shape:
        got = (a.dtype, a.shape) if isinstance(a, np.ndarray) else type(a).__name__
        raise TableError(f"snapshot array {name!r} must be {np.dtype(dtype)} {shape}, got {got}")
    return a


def _check_slots(what: str, slots: np.ndarray, free: np.ndarray, top: int) -> None:
    both = np.concatenate([slots, free])
    if len(both) != top or (top and (both.min() < 0 or both.max() >= top)) \
            or len(np.unique(both)) != top:
        raise TableError(f"snapshot {what}: slots and free slots must cover 0..{top - 1} once")


class _Restored:
    """A table's state rebuilt from snapshot arrays, checked before anything is replaced."""

    def __init__(self, table: SparseTable, arrays: dict[str, np.ndarray]):
        meta_i, meta_f = table.config_arrays()
        got_i = _array(arrays, "meta_i", np.int64, meta_i.shape)
        got_f = _array(arrays, "meta_f", np.float64, meta_f.shape)
        if not (np.array_equal(got_i, meta_i) and np.array_equal(got_f, meta_f)):
            raise TableError(f"snapshot is of another table configuration: {got_i.tolist()} "
                             f"{got_f.tolist()}, this table has {meta_i.tolist()} "
                             f"{meta_f.tolist()}")
        cfg = table.config
        state = _array(arrays, "state", np.int64, (2 + len(COUNTERS),))
        self.tick, top = int(state[0]), int(state[1])
        self.count = dict(zip(COUNTERS, (int(v) for v in state[2:])))
        n = len(arrays["keys"])
        keys = _array(arrays, "keys", np.int64, (n,))
        slots = _array(arrays, "slots", np.int64, (n,))
        free = arrays["free"]
        free = _array(arrays, "free", np.int64, (len(free),))
        if not (0 <= n <= cfg.capacity and 0 <= top <= cfg.capacity and self.tick >= 0):
            raise TableError(f"snapshot holds {n} rows and {top} slots, capacity {cfg.capacity}")
        _check_slots("rows", slots, free, top)
        if len(np.unique(keys)) != n:
            raise TableError("snapshot keys must be unique")
        rows = _array(arrays, "rows", np.float32, (n, cfg.dim))
        accum = (_array(arrays, "accum", np.float32, (n, cfg.dim))
                 if cfg.optimizer == "adagrad" else None)
        for a in (rows, accum):
            if a is not None and not np.isfinite(a).all():
                raise TableError("snapshot rows and accumulators must be finite")
        last = _array(arrays, "last", np.int64, (n,))
        freq = _array(arrays, "freq", np.int64, (n,))
        length = min(cfg.capacity, max(top, 1024))
        self.pool = SlotPool(top, free)
        self.index = KeyIndex()
        self.index.insert(keys, slots)
        self.slot_key = np.zeros(length, np.int64)
        self.slot_key[slots] = keys
        self.rows = np.zeros((length, cfg.dim), np.float32)
        self.rows[slots] = rows
        self.accum = None
        if accum is not None:
            self.accum = np.zeros((length, cfg.dim), np.float32)
            self.accum[slots] = accum
        self.last = np.zeros(length, np.int64)
        self.last[slots] = last
        self.freq = np.zeros(length, np.int64)
        self.freq[slots] = freq
        self.cand = None
        if cfg.admit_after > 1:
            self.cand = self._candidates(arrays, cfg)

    @staticmethod
    def _candidates(arrays, cfg: TableConfig) -> Candidates:
        m = len(arrays["cand_keys"])
        ck = _array(arrays, "cand_keys", np.int64, (m,))
        cs = _array(arrays, "cand_slots", np.int64, (m,))
        cc = _array(arrays, "cand_count", np.int64, (m,))
        cl = _array(arrays, "cand_last", np.int64, (m,))
        cfree = arrays["cand_free"]
        cfree = _array(arrays, "cand_free", np.int64, (len(cfree),))
        ctop = int(_array(arrays, "cand_top", np.int64, (1,))[0])
        if not 0 <= ctop <= cfg.candidates:
            raise TableError(f"snapshot holds {ctop} candidate slots, limit {cfg.candidates}")
        _check_slots("candidates", cs, cfree, ctop)
        if len(np.unique(ck)) != m:
            raise TableError("snapshot candidate keys must be unique")
        cand = Candidates(cfg.candidates, cfg.evict_fraction)
        cand.pool = SlotPool(ctop, cfree)
        cand.index.insert(ck, cs)
        cand.keys = np.zeros(ctop, np.int64)
        cand.count = np.zeros(ctop, np.int64)
        cand.last = np.zeros(ctop, np.int64)
        cand.keys[cs], cand.count[cs], cand.last[cs] = ck, cc, cl
        return cand

    def install(self, t: SparseTable) -> None:
        t._index, t._pool, t._slot_key = self.index, self.pool, self.slot_key
        t._rows, t._accum, t._last, t._freq = self.rows, self.accum, self.last, self.freq
        t._cand, t._tick, t._count = self.cand, self.tick, self.count
        t._memo = None
