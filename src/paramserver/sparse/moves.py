"""Rows of a sparse table changing shards: when servers join or leave a running job (live
resharding) and when a job resumes on another number of servers. Pure: no I/O, clock, threads.

A key's shard is `placement.shard_of(key, servers)`, so a new server count places most keys
anew. `split` takes a table's rows, their optimizer state and its admission candidates apart
by their new owner into `RowBundle`s; `gather` makes a table of the new count's capacity from
every bundle its shard receives, the rows exact (values, accumulators, push counts).

Recency is kept as an age (pushes of the source table since the row's last push): tables of
different shards count pushes apart, and the gathered table's clock is the largest of its
sources', each row as old as it was. A gathered table over its capacity (a server joined, so
every share is smaller) keeps the rows its eviction rule would (lru: the most recent; lfu: the
most pushed, then the most recent), the rest counted `evicted`; candidates over their limit
keep the most recently seen. Counters other than evicted stay those of the shard's own table
(zeros for a joining server): they count what was done on this shard, not what moved in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paramserver.sparse.table import COUNTERS, SparseTable, TableError

# The wire order of a bundle's arrays (accum only for adagrad tables).
FRAMES = ("keys", "rows", "accum", "age", "freq", "cand_keys", "cand_count", "cand_age")
_ROW_FIELDS = ("keys", "rows", "accum", "age", "freq")
_CAND_FIELDS = ("cand_keys", "cand_count", "cand_age")


@dataclass(frozen=True)
class RowBundle:
    """Rows of one table bound for one shard, from one source table whose clock read `tick`:
    keys (int64), rows and accumulators (float32, (n, dim); accum None for SGD), ages and push
    counts (int64), and admission candidates (keys, counts, ages)."""

    tick: int
    keys: np.ndarray
    rows: np.ndarray
    accum: np.ndarray | None
    age: np.ndarray
    freq: np.ndarray
    cand_keys: np.ndarray
    cand_count: np.ndarray
    cand_age: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def items(self) -> int:
        """Rows and candidates: what a piece's size counts."""
        return len(self.keys) + len(self.cand_keys)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.frames())

    @classmethod
    def empty(cls, dim: int, adagrad: bool, tick: int = 0) -> "RowBundle":
        z = np.zeros(0, np.int64)
        rows = np.zeros((0, dim), np.float32)
        return cls(tick, z, rows, rows.copy() if adagrad else None, z, z, z, z, z)

    def take(self, rows, cands) -> "RowBundle":
        """The bundle of the rows and candidates that `rows` and `cands` (indices or masks)
        pick."""
        return RowBundle(self.tick, self.keys[rows], self.rows[rows],
                         None if self.accum is None else self.accum[rows], self.age[rows],
                         self.freq[rows], self.cand_keys[cands], self.cand_count[cands],
                         self.cand_age[cands])

    def pieces(self, max_items: int) -> list["RowBundle"]:
        """This bundle in pieces of at most `max_items` rows and candidates each (at least one
        piece, maybe empty: a receiver counts the pieces of every sender)."""
        step = max(1, int(max_items))
        n, m = len(self.keys), len(self.cand_keys)
        out = [self.take(slice(a, min(a + step, n)), slice(0, 0)) for a in range(0, n, step)]
        out += [self.take(slice(0, 0), slice(a, min(a + step, m))) for a in range(0, m, step)]
        return out or [self]

    def frames(self) -> list[np.ndarray]:
        """The arrays in FRAMES order, rows flattened (the wire carries 1-D arrays)."""
        return [getattr(self, name).reshape(-1) for name in FRAMES
                if getattr(self, name) is not None]

    @classmethod
    def from_frames(cls, tick: int, frames: list, dim: int, adagrad: bool) -> "RowBundle":
        """A bundle from its wire arrays, checked (TableError naming what is wrong): dtypes,
        lengths that agree, finite rows, ages and counts not negative."""
        names = [n for n in FRAMES if adagrad or n != "accum"]
        if len(frames) != len(names):
            raise TableError(f"rows of a {'adagrad' if adagrad else 'sgd'} table come in "
                             f"{len(names)} arrays, got {len(frames)}")
        got = dict(zip(names, frames))
        if isinstance(tick, bool) or not isinstance(tick, int) or tick < 0:
            raise TableError(f"a bundle's tick must be an int >= 0, got {tick!r}")
        n, m = _length(got, "keys"), _length(got, "cand_keys")
        for name in names:
            a = got[name]
            want = np.float32 if name in ("rows", "accum") else np.int64
            size = (n * dim if name in ("rows", "accum")
                    else m if name.startswith("cand_") else n)
            if not isinstance(a, np.ndarray) or a.dtype != want or a.shape != (size,):
                shown = (a.dtype, a.shape) if isinstance(a, np.ndarray) else type(a).__name__
                raise TableError(f"bundle array {name!r} must be {np.dtype(want)} ({size},), "
                                 f"got {shown}")
        for name in ("rows", "accum"):
            if name in got and not np.isfinite(got[name]).all():
                raise TableError(f"bundle {name} must be finite")
        for name in ("age", "freq", "cand_count", "cand_age"):
            if got[name].size and got[name].min() < 0:
                raise TableError(f"bundle {name} must not be negative")
        rows = got["rows"].reshape(n, dim)
        accum = got["accum"].reshape(n, dim) if adagrad else None
        return cls(tick, got["keys"], rows, accum, got["age"], got["freq"], got["cand_keys"],
                   got["cand_count"], got["cand_age"])


def _length(arrays: dict, name: str) -> int:
    a = arrays[name]
    if not isinstance(a, np.ndarray) or a.ndim != 1:
        raise TableError(f"bundle array {name!r} must be a 1-D array")
    return len(a)


def split(table: SparseTable, owner) -> dict[int, RowBundle]:
    """`table`'s rows and candidates by their new shard: `owner(keys) -> int array` (e.g.
    shard_of under the new count). Every owner that gets anything is a key of the result."""
    snap = table.snapshot()
    tick = int(snap["state"][0])
    whole = RowBundle(
        tick, snap["keys"], snap["rows"], snap.get("accum"), tick - snap["last"], snap["freq"],
        *(_candidates(snap, tick)))
    row_owner = np.asarray(owner(whole.keys), np.int64)
    cand_owner = np.asarray(owner(whole.cand_keys), np.int64)
    return {int(o): whole.take(row_owner == o, cand_owner == o)
            for o in np.union1d(row_owner, cand_owner)}


def _candidates(snap: dict, tick: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if "cand_keys" not in snap:
        z = np.zeros(0, np.int64)
        return z, z, z
    return snap["cand_keys"], snap["cand_count"], tick - snap["cand_last"]


def concat(bundles: list[RowBundle], dim: int, adagrad: bool) -> RowBundle:
    """One bundle of all of them at the latest of their clocks (each row's age kept)."""
    if any((b.accum is not None) != adagrad for b in bundles):
        raise TableError("bundles of adagrad and sgd tables cannot be gathered together")
    parts = [RowBundle.empty(dim, adagrad), *bundles]

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(b, name) for b in parts])

    return RowBundle(max(b.tick for b in parts), cat("keys"), cat("rows"),
                     cat("accum") if adagrad else None, cat("age"), cat("freq"),
                     cat("cand_keys"), cat("cand_count"), cat("cand_age"))


def gather(table: SparseTable, bundles: list[RowBundle], counters: dict | None = None) -> int:
    """Make `table` (of its new capacity; whatever it held is replaced) hold the rows and
    candidates of `bundles`, keeping within its capacity as its eviction rule would; its
    counters `counters` (the shard's own table's; zeros if None) plus what was evicted here.
    TableError, the table unchanged, when a key comes twice. Returns the rows evicted."""
    cfg = table.config
    both = concat(list(bundles), cfg.dim, table.adagrad)
    if len(np.unique(both.keys)) != len(both.keys):
        raise TableError("a row came from two shards: the bundles are of different reshards")
    if len(np.unique(both.cand_keys)) != len(both.cand_keys):
        raise TableError("an admission candidate came from two shards")
    # A key admitted on one side while counted on another cannot happen under one placement;
    # the row wins.
    cands = np.flatnonzero(~np.isin(both.cand_keys, both.keys))
    rows = np.arange(len(both))
    evicted = max(0, len(rows) - cfg.capacity)
    if evicted:
        # Kept: lowest age (lru), or highest count then lowest age (lfu); key order breaks ties
        # so every run keeps the same rows.
        order = (np.lexsort((both.keys, both.age, -both.freq)) if cfg.evict == "lfu"
                 else np.lexsort((both.keys, both.age)))
        rows = order[:cfg.capacity]
    if len(cands) > cfg.candidates:
        order = np.lexsort((both.cand_keys[cands], -both.cand_count[cands],
                            both.cand_age[cands]))
        cands = cands[order[:cfg.candidates]]
    kept = both.take(np.sort(rows), np.sort(cands))
    tick = max(kept.tick, int(kept.age.max(initial=0)), int(kept.cand_age.max(initial=0)))
    kept = replace(kept, tick=tick)
    table.restore(_snapshot(table, kept, _counters(counters, evicted)))
    return evicted


def _counters(counters: dict | None, evicted: int) -> list[int]:
    c = dict.fromkeys(COUNTERS, 0)
    c.update({k: int(v) for k, v in (counters or {}).items() if k in c})
    c["evicted"] += evicted
    return [c[k] for k in COUNTERS]


def _snapshot(table: SparseTable, b: RowBundle, counters: list[int]) -> dict[str, np.ndarray]:
    """The arrays SparseTable.restore reads for a table holding bundle `b` in slots 0..n-1."""
    meta_i, meta_f = table.config_arrays()
    n, m = len(b.keys), len(b.cand_keys)
    z = np.zeros(0, np.int64)
    out = {"meta_i": meta_i, "meta_f": meta_f,
           "state": np.array([b.tick, n, *counters], np.int64),
           "keys": b.keys.astype(np.int64), "slots": np.arange(n, dtype=np.int64),
           "rows": np.ascontiguousarray(b.rows, np.float32), "last": b.tick - b.age,
           "freq": b.freq.astype(np.int64), "free": z}
    if b.accum is not None:
        out["accum"] = np.ascontiguousarray(b.accum, np.float32)
    if table.config.admit_after > 1:
        out.update(cand_keys=b.cand_keys.astype(np.int64), cand_slots=np.arange(m, dtype=np.int64),
                   cand_count=b.cand_count.astype(np.int64), cand_last=b.tick - b.cand_age,
                   cand_free=z, cand_top=np.array([m], np.int64))
    return out
