"""The sparse table (paramserver.sparse): per-key init, placement, the key index, and
SparseTable's updates, admission, eviction, counters, snapshot/restore and bad input, checked
against independent references (a dict of rows with a per-key optimizer loop, and torch)."""
import itertools
import math

import numpy as np
import pytest
import torch

from paramserver.sparse import keymap
from paramserver.sparse import table as sparse_table
from paramserver.sparse.init import initial_rows
from paramserver.sparse.keymap import KeyIndex
from paramserver.sparse.placement import shard_of
from paramserver.sparse.table import MAX_KEYS_PER_REQUEST, SparseTable, TableError

F32 = np.float32


def rand_keys(rng, n, space=None):
    if space is None:
        return rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64)
    return rng.integers(-space, space, n, dtype=np.int64)


def zipf_keys(rng, n, alpha=1.2, space=200):
    """Keys with many repeats: a Zipf head scattered over signed 64-bit values."""
    ids = np.minimum(rng.zipf(alpha, n), space).astype(np.int64)
    return ids * np.int64(-0x61C8864680B583EB)     # wraps: negatives and large keys


# ---- init --------------------------------------------------------------------------------

def test_initial_rows_depend_only_on_seed_and_key():
    rng = np.random.default_rng(1)
    keys = np.concatenate([rand_keys(rng, 500), np.array([0, -1, 1, 2**63 - 1, -2**63])])
    rows = initial_rows(keys, 7, 0.5, seed=3)
    assert rows.dtype == F32 and rows.shape == (len(keys), 7)
    perm = rng.permutation(len(keys))
    assert np.array_equal(initial_rows(keys[perm], 7, 0.5, seed=3), rows[perm])
    # Split into batches, and each key alone: the same rows.
    parts = [initial_rows(p, 7, 0.5, seed=3) for p in np.array_split(keys, 7)]
    assert np.array_equal(np.concatenate(parts), rows)
    assert np.array_equal(initial_rows(keys[-3:-2], 7, 0.5, seed=3), rows[-3:-2])
    # Columns do not depend on dim (a prefix), other seeds and keys differ.
    assert np.array_equal(initial_rows(keys, 4, 0.5, seed=3), rows[:, :4])
    other = initial_rows(keys, 7, 0.5, seed=4)
    assert (other != rows).mean() > 0.99
    assert len(np.unique(rows[:, 0])) > 0.99 * len(keys)
    # Scale: linear and inside (-scale, scale); 0 gives zeros.
    assert np.abs(rows).max() < 0.5
    assert np.allclose(initial_rows(keys, 7, 0.25, seed=3), rows / 2, rtol=1e-6, atol=0)
    assert not initial_rows(keys, 7, 0.0).any()


def test_initial_rows_are_uniform():
    rows = initial_rows(np.arange(20_000, dtype=np.int64), 16, 1.0).ravel()
    assert abs(rows.mean()) < 0.01
    assert abs(rows.std() - 1 / math.sqrt(3)) < 0.01
    hist, _ = np.histogram(rows, bins=10, range=(-1, 1))
    assert hist.min() > 0.9 * len(rows) / 10
    # Neighbouring columns and keys are uncorrelated.
    m = initial_rows(np.arange(20_000, dtype=np.int64), 16, 1.0)
    assert abs(np.corrcoef(m[:, 0], m[:, 1])[0, 1]) < 0.03
    assert abs(np.corrcoef(m[:-1, 0], m[1:, 0])[0, 1]) < 0.03


@pytest.mark.parametrize("bad", [dict(keys=np.arange(3, dtype=np.int32)),
                                 dict(keys=np.zeros((2, 2), np.int64)),
                                 dict(scale=float("nan")), dict(scale=-1.0),
                                 dict(scale=float("inf")), dict(dim=0)])
def test_initial_rows_refuse_bad_input(bad):
    args = dict(keys=np.arange(3, dtype=np.int64), dim=4, scale=0.1) | bad
    with pytest.raises(ValueError):
        initial_rows(args["keys"], args["dim"], args["scale"])


# ---- placement ---------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", ["sequential", "stride", "high_bits", "random"])
def test_shard_of_spreads_structured_ids(pattern):
    n, shards = 80_000, 8
    base = np.arange(n, dtype=np.int64)
    keys = {"sequential": base, "stride": base * 4096,
            "high_bits": (base % 16) << 48 | (base // 16) * 64,
            "random": rand_keys(np.random.default_rng(2), n)}[pattern]
    s = shard_of(keys, shards)
    assert s.dtype == np.int64 and s.min() >= 0 and s.max() < shards
    counts = np.bincount(s, minlength=shards)
    assert counts.min() > 0.95 * n / shards and counts.max() < 1.05 * n / shards
    assert np.array_equal(shard_of(keys[::-1], shards), s[::-1])
    assert not shard_of(keys, 1).any()
    with pytest.raises(ValueError):
        shard_of(keys.astype(np.uint64), shards)
    with pytest.raises(ValueError):
        shard_of(keys, 0)


def test_shards_and_index_slots_are_independent():
    # A shard's keys must spread over all of its index's home slots, not a residue class.
    keys = np.arange(200_000, dtype=np.int64)
    mine = keys[shard_of(keys, 4) == 1]
    ix = KeyIndex(1024)
    homes = np.bincount(ix._home(mine), minlength=1024)
    assert homes.min() > 0


# ---- the key index -----------------------------------------------------------------------

def test_key_index_matches_a_dict_through_inserts_removes_and_rebuilds():
    rng = np.random.default_rng(3)
    ix, ref = KeyIndex(), {}
    sizes = set()
    for step in range(300):
        keys = np.unique(np.concatenate([rand_keys(rng, 400, 30_000), rand_keys(rng, 50)]))
        vals, where = ix.find(keys)
        assert vals.tolist() == [ref.get(int(k), -1) for k in keys]
        assert ((where >= 0) == (vals >= 0)).all()
        new = keys[vals < 0]
        ix.insert(new, np.full(len(new), step, np.int64))
        ref.update({int(k): step for k in new})
        gone = keys[vals >= 0][: rng.integers(0, 300)]
        ix.remove_at(ix.find(gone)[1])
        for k in gone:
            del ref[int(k)]
        assert len(ix) == len(ref)
        assert ix.live + ix.deleted <= keymap.MAX_LOAD * ix.size
        sizes.add(ix.size)
    assert len(sizes) > 2                     # it did grow and rebuild on the way
    k, v = ix.items()
    assert dict(zip(k.tolist(), v.tolist())) == ref
    # Duplicates in a lookup are fine.
    some = np.array(list(ref)[:5] * 3, np.int64)
    assert ix.get(some).tolist() == [ref[int(x)] for x in some]


# ---- SparseTable against references ------------------------------------------------------

class DictTable:
    """The reference: a dict of rows and a per-key loop, written from the definitions."""

    def __init__(self, dim, optimizer, lr, scale, seed=0, admit_after=1):
        self.dim, self.opt, self.lr = dim, optimizer, F32(lr)
        self.scale, self.seed, self.admit_after = scale, seed, admit_after
        self.rows, self.acc, self.seen = {}, {}, {}

    def init(self, k):
        return initial_rows(np.array([k], np.int64), self.dim, self.scale, self.seed)[0]

    def pull(self, keys):
        return np.stack([self.rows.get(int(k), self.init(k)) for k in keys]) if len(keys) \
            else np.zeros((0, self.dim), F32)

    def push(self, keys, grads, scale=1.0):
        sums = {}
        for k, g in zip(keys.tolist(), grads.astype(np.float64)):
            sums[k] = sums[k] + g if k in sums else g.copy()
        for k, g in sums.items():
            g = g.astype(F32) * F32(scale)
            if k not in self.rows:
                self.seen[k] = self.seen.get(k, 0) + 1
                if self.seen[k] < self.admit_after:
                    continue
                del self.seen[k]
                self.rows[k], self.acc[k] = self.init(k), np.zeros(self.dim, F32)
            if self.opt == "adagrad":
                self.acc[k] = self.acc[k] + g * g
                g = g / (np.sqrt(self.acc[k]) + F32(1e-10))
            self.rows[k] = self.rows[k] - self.lr * g


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
@pytest.mark.parametrize("admit_after", [1, 3])
def test_equals_dict_reference_over_repeated_keys(optimizer, admit_after):
    rng = np.random.default_rng(4)
    dim = 5
    t = SparseTable(dim, optimizer=optimizer, lr=0.1, init_scale=0.2, capacity=10_000,
                    admit_after=admit_after, seed=9)
    ref = DictTable(dim, optimizer, 0.1, 0.2, seed=9, admit_after=admit_after)
    probe = zipf_keys(rng, 300)
    for step in range(60):
        n = int(rng.integers(0, 300))
        keys = zipf_keys(rng, n)
        grads = rng.standard_normal((n, dim)).astype(F32)
        scale = [1.0, 0.5, 3.0][step % 3]
        t.push(keys, grads, scale=scale)
        ref.push(keys, grads, scale=scale)
        np.testing.assert_array_equal(t.pull(keys), ref.pull(keys))
        np.testing.assert_array_equal(t.pull(probe), ref.pull(probe))
    assert len(t) == len(ref.rows) > 50
    c = t.counters()
    assert c["created"] == len(ref.rows) and c["evicted"] == 0


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
def test_matches_torch_sparse_embedding_and_optimizer(optimizer):
    rng = np.random.default_rng(5)
    dim, lr, space = 8, 0.05, 400
    key_of = rand_keys(rng, space)                    # dense index i <-> key key_of[i]
    t = SparseTable(dim, optimizer=optimizer, lr=lr, init_scale=0.1, capacity=space)
    emb = torch.nn.Embedding(space, dim, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(initial_rows(key_of, dim, 0.1)))
    opt = (torch.optim.Adagrad(emb.parameters(), lr=lr, initial_accumulator_value=0.0,
                               eps=1e-10) if optimizer == "adagrad"
           else torch.optim.SGD(emb.parameters(), lr=lr))
    for _ in range(40):
        idx = np.minimum(rng.zipf(1.1, 512), space) - 1
        grads = rng.standard_normal((len(idx), dim)).astype(F32)
        t.push(key_of[idx], grads)
        opt.zero_grad()
        (emb(torch.from_numpy(idx)) * torch.from_numpy(grads)).sum().backward()
        opt.step()
    pulled = t.pull(key_of)
    np.testing.assert_allclose(pulled, emb.weight.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert (pulled != initial_rows(key_of, dim, 0.1)).any(axis=1).sum() == len(t)


def test_pull_creates_nothing_and_reads_initial_rows():
    t = SparseTable(3, init_scale=0.3, seed=5)
    keys = np.array([7, -7, 2**62], np.int64)
    np.testing.assert_array_equal(t.pull(keys), initial_rows(keys, 3, 0.3, seed=5))
    assert len(t) == 0 and t.counters()["created"] == 0 and t.counters()["pulled_keys"] == 3
    t.push(keys[:1], np.ones((1, 3), F32))
    out = t.pull(np.array([7, 7, -7], np.int64))
    assert np.array_equal(out[0], out[1]) and not np.array_equal(out[0], keys[:0])
    np.testing.assert_array_equal(out[2], initial_rows(keys[1:2], 3, 0.3, seed=5)[0])
    assert t.pull(np.zeros(0, np.int64)).shape == (0, 3)


def test_same_key_same_row_in_two_tables_in_any_order():
    rng = np.random.default_rng(6)
    keys = rand_keys(rng, 1000)
    a, b = SparseTable(4, seed=1), SparseTable(4, seed=1)
    a.push(keys, np.zeros((1000, 4), F32), scale=0.0)
    for part in np.array_split(keys[::-1], 9):
        b.push(part, np.zeros((len(part), 4), F32))
    np.testing.assert_array_equal(a.pull(keys), b.pull(keys))
    np.testing.assert_array_equal(a.pull(keys), initial_rows(keys, 4, 0.01, seed=1))
    assert (SparseTable(4, seed=2).pull(keys) != a.pull(keys)).any()


# ---- admission ---------------------------------------------------------------------------

def test_admission_needs_k_pushes_and_counts_the_rest():
    t = SparseTable(2, optimizer="sgd", lr=1.0, init_scale=0.0, admit_after=3)
    one = np.ones((1, 2), F32)
    a, b = np.array([10], np.int64), np.array([-20], np.int64)
    t.push(a, one)
    t.push(np.array([10, 10, -20], np.int64), np.ones((3, 2), F32))   # a: 2nd push, b: 1st
    c = t.counters()
    assert len(t) == 0 and c["not_admitted"] == 3 and c["candidates"] == 2
    assert not t.pull(a).any()                                         # nothing stored yet
    t.push(a, one * 2)                                                 # a: 3rd push: admitted
    np.testing.assert_array_equal(t.pull(a), [[-2.0, -2.0]])           # only this push's grad
    t.push(b, one)
    assert len(t) == 1
    t.push(b, one)
    np.testing.assert_array_equal(t.pull(b), [[-1.0, -1.0]])
    c = t.counters()
    assert (c["rows"], c["created"], c["admitted"], c["not_admitted"], c["candidates"]) \
        == (2, 2, 2, 4, 0)


def test_admission_candidates_are_bounded_and_forget_the_oldest():
    t = SparseTable(1, admit_after=2, capacity=100, candidates=4, evict_fraction=0.01)
    for k in range(6):                              # 0..5 once each: 0 and 1 forgotten
        t.push(np.array([k], np.int64), np.ones((1, 1), F32))
    assert t.counters()["candidates"] == 4
    t.push(np.array([0, 5], np.int64), np.ones((2, 1), F32))
    assert t.counters()["rows"] == 1                # 5 admitted, 0 started over
    assert t._index.get(np.array([5, 0], np.int64)).tolist()[1] == -1
    t.push(np.array([0], np.int64), np.ones((1, 1), F32))
    assert t.counters()["rows"] == 2


# ---- eviction ----------------------------------------------------------------------------

def push1(t, *keys):
    k = np.array(keys, np.int64)
    t.push(k, np.ones((len(k), t.dim), F32))


def resident(t):
    return sorted(int(k) for k in t._index.items()[0])


def test_lru_evicts_the_least_recently_pushed():
    t = SparseTable(1, capacity=4, evict="lru", evict_fraction=0.01)
    for k in (1, 2, 3, 4):
        push1(t, k)
    push1(t, 1)               # 2 is now the oldest
    push1(t, 5)
    assert resident(t) == [1, 3, 4, 5]
    push1(t, 3)
    push1(t, 6, 7)            # 4 and 1 go
    assert resident(t) == [3, 5, 6, 7]
    push1(t, 5, 8)            # 5 is touched by this push: 3 goes, not 5
    assert resident(t) == [5, 6, 7, 8]
    c = t.counters()
    assert c["evicted"] == 4 and c["created"] == 8 == c["rows"] + c["evicted"]
    # An evicted key reads as its initial row again, and restarts from it.
    np.testing.assert_array_equal(t.pull(np.array([2], np.int64)),
                                  initial_rows(np.array([2], np.int64), 1, 0.01))


def test_lfu_evicts_the_least_often_pushed_older_first():
    t = SparseTable(1, capacity=4, evict="lfu", evict_fraction=0.01)
    push1(t, 1, 2, 3, 4)
    push1(t, 1, 2)
    push1(t, 1, 4)            # counts: 1:3, 2:2, 3:1, 4:2
    push1(t, 5)               # 3 goes (count 1)
    assert resident(t) == [1, 2, 4, 5]
    push1(t, 6)               # 5 (count 1) goes before the older but more used 2 and 4
    assert resident(t) == [1, 2, 4, 6]
    push1(t, 7, 8)            # 6 (1), then 2 (2, older than 4)
    assert resident(t) == [1, 4, 7, 8]


def test_batch_eviction_frees_a_fraction_and_keeps_the_newest():
    t = SparseTable(1, capacity=100, evict="lru", evict_fraction=0.1)
    for k in range(100):
        push1(t, k)
    push1(t, 100)
    assert len(t) == 91 and t.counters()["evicted"] == 10
    assert resident(t) == list(range(10, 101))


def test_more_new_keys_than_capacity_in_one_push_are_dropped_and_counted():
    t = SparseTable(2, capacity=8)
    push1(t, 100, 101)
    push1(t, *range(20))      # 100 and 101 are evicted; 8 of the 20 get rows
    c = t.counters()
    assert (c["rows"], c["created"], c["evicted"], c["dropped"]) == (8, 10, 2, 12)
    push1(t, *range(3), 500)  # touched rows are never evicted to make room
    assert {0, 1, 2, 500} <= set(resident(t)) and len(t) == 8


def test_counters_add_up_on_a_stream():
    rng = np.random.default_rng(7)
    t = SparseTable(4, capacity=300, admit_after=2, evict="lfu", candidates=500)
    unique_pushed = 0
    for _ in range(200):
        keys = zipf_keys(rng, 256, alpha=1.05, space=5000)
        unique_pushed += len(np.unique(keys))
        t.push(keys, rng.standard_normal((256, 4)).astype(F32))
        t.pull(keys[:10])
    c = t.counters()
    assert c["created"] == c["rows"] + c["evicted"]
    assert c["admitted"] == c["created"] + c["dropped"]
    assert c["updated"] + c["admitted"] + c["not_admitted"] == unique_pushed
    assert c["rows"] <= 300 and c["candidates"] <= 500 and c["evicted"] > 0
    assert (c["pushes"], c["pushed_keys"], c["pulls"], c["pulled_keys"]) == (200, 51200, 200, 2000)


# ---- snapshot / restore ------------------------------------------------------------------

def evolve(t, rng, steps, space=3000):
    for _ in range(steps):
        keys = zipf_keys(rng, 200, alpha=1.1, space=space)
        t.push(keys, rng.standard_normal((200, t.dim)).astype(F32), scale=0.5)


def snapshots_equal(a, b):
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kw", [dict(optimizer="adagrad", evict="lru", admit_after=2),
                                dict(optimizer="sgd", evict="lfu", admit_after=1),
                                dict(optimizer="adagrad", evict="lfu", admit_after=3)])
def test_snapshot_restore_gives_an_equal_table_that_evolves_identically(kw):
    rng = np.random.default_rng(8)
    t = SparseTable(6, capacity=150, candidates=300, **kw)
    evolve(t, rng, 80)
    snap = t.snapshot()
    assert len(snap["keys"]) == len(t) <= 150 and len(snap["rows"]) == len(t)
    u = SparseTable(6, capacity=150, candidates=300, **kw)
    evolve(u, np.random.default_rng(99), 5)              # a table with other content
    u.restore({k: v.copy() for k, v in snap.items()})
    assert snapshots_equal(u.snapshot(), snap) and u.counters() == t.counters()
    probe = zipf_keys(rng, 500, space=3000)
    np.testing.assert_array_equal(u.pull(probe), t.pull(probe))
    # Both go on the same way (admission, eviction victims, slots) under the same pushes.
    evolve(t, np.random.default_rng(10), 60)
    evolve(u, np.random.default_rng(10), 60)
    assert snapshots_equal(u.snapshot(), t.snapshot())
    assert t.counters()["evicted"] > 0


def test_restore_refuses_bad_snapshots_and_keeps_the_table():
    rng = np.random.default_rng(11)
    t = SparseTable(3, capacity=50, admit_after=2)
    evolve(t, rng, 20, space=100)
    good = t.snapshot()
    other = SparseTable(3, capacity=50, admit_after=2)
    evolve(other, rng, 3, space=100)
    before = other.snapshot()
    bad = [
        {k: v for k, v in good.items() if k != "accum"},
        good | {"rows": good["rows"][:, :2]},
        good | {"rows": good["rows"].astype(np.float64)},
        good | {"slots": np.zeros_like(good["slots"])},
        good | {"keys": np.zeros_like(good["keys"])},
        good | {"free": good["free"][:0]} if len(good["free"]) else good | {"free": np.ones(1,
                                                                           np.int64)},
        good | {"rows": np.full_like(good["rows"], np.nan)},
        "not a dict",
    ]
    for snap in bad:
        with pytest.raises(TableError):
            other.restore(snap)
        assert snapshots_equal(other.snapshot(), before)
    for kw in (dict(capacity=60), dict(optimizer="sgd"), dict(dim=4)):
        with pytest.raises(TableError):
            SparseTable(**(dict(dim=3, capacity=50, admit_after=2) | kw)).restore(good)


# ---- bad input ---------------------------------------------------------------------------

def test_bad_input_is_refused_and_leaves_the_table_unchanged():
    rng = np.random.default_rng(12)
    t = SparseTable(4, capacity=100, admit_after=2)
    evolve(t, rng, 10, space=300)
    before, counters = t.snapshot(), t.counters()
    k3 = np.array([1, 2, 3], np.int64)
    g3 = np.ones((3, 4), F32)
    nan = g3.copy()
    nan[1, 2] = np.nan
    cases = [
        (k3.astype(np.int32), g3, 1.0), (k3.astype(np.uint64), g3, 1.0),
        (k3.astype(np.float64), g3, 1.0), ([1, 2, 3], g3, 1.0), (k3.reshape(3, 1), g3, 1.0),
        (k3, g3.astype(np.float64), 1.0), (k3, g3[:, :3], 1.0), (k3, g3[:2], 1.0),
        (k3, g3.ravel(), 1.0), (k3, g3.tolist(), 1.0), (k3, nan, 1.0),
        (k3, g3, float("nan")), (k3, g3, float("inf")), (k3, g3, "1"),
        (np.zeros(MAX_KEYS_PER_REQUEST + 1, np.int64),
         np.zeros((MAX_KEYS_PER_REQUEST + 1, 4), F32), 1.0),
    ]
    for keys, grads, scale in cases:
        with pytest.raises(TableError):
            t.push(keys, grads, scale=scale)
    for keys in (k3.astype(np.int32), [1], k3.reshape(1, 3),
                 np.zeros(MAX_KEYS_PER_REQUEST + 1, np.int64)):
        with pytest.raises(TableError):
            t.pull(keys)
    assert snapshots_equal(t.snapshot(), before) and t.counters() == counters
    with pytest.raises(TableError, match="int64"):
        t.push(k3.astype(np.int32), g3)


@pytest.mark.parametrize("kw", [dict(dim=0), dict(optimizer="adam"), dict(lr=float("nan")),
                                dict(init_scale=-1.0), dict(capacity=0), dict(admit_after=0),
                                dict(evict="fifo"), dict(evict_fraction=0.0),
                                dict(capacity=2.5), dict(init_scale=float("nan"))])
def test_bad_configuration_is_refused(kw):
    with pytest.raises(TableError):
        SparseTable(**(dict(dim=4) | kw))


def test_of_reads_a_spec():
    class Spec:
        dim, optimizer, lr, init_scale, admit_after, evict = 3, "sgd", 0.5, 0.0, 2, "lfu"
    t = SparseTable.of(Spec(), capacity=10, seed=4)
    assert t.config.capacity == 10 and t.config.evict == "lfu" and t.config.seed == 4
    assert t.config.optimizer == "sgd" and t.config.admit_after == 2


# ---- memory ------------------------------------------------------------------------------

@pytest.mark.parametrize("admit_after", [1, 2])
def test_memory_stays_bounded_by_capacity_over_a_long_stream(admit_after):
    """10^6 distinct keys (each in two pushes in a row, so admission lets them in) through
    10^4 rows."""
    cap, dim, batch = 10_000, 16, 4096
    half = batch // 2
    t = SparseTable(dim, capacity=cap, admit_after=admit_after)
    grads = np.ones((batch, dim), F32)
    peak = 0
    for start in range(0, 1_000_000, half):
        ids = np.arange(start - half, start + half, dtype=np.int64)
        t.push(ids * np.int64(0x5851F42D4C957F2D), grads)
        peak = max(peak, t.nbytes())
    c = t.counters()
    assert c["rows"] <= cap and c["created"] == c["rows"] + c["evicted"]
    assert c["created"] > 900_000 and c["candidates"] <= cap
    # Bound from capacity alone: per row slot, the row and its Adagrad state (2 * dim * 4)
    # and 3 int64 (key, last touch, count); the free-slot stack (<= 2 * cap int64); the key
    # index (SLOT_BYTES a position, <= 2 * (cap + batch) / REBUILD_LOAD + PAD positions); the
    # candidates the same again without the rows.
    per_slot = 2 * dim * 4 + 3 * 8
    index = keymap.SLOT_BYTES * (2 * (cap + batch) / keymap.REBUILD_LOAD + keymap.PAD)
    bound = cap * per_slot + 2 * cap * 8 + index
    if admit_after > 1:
        bound += cap * 3 * 8 + 2 * cap * 8 + index
    assert peak <= bound, (peak, bound)


@pytest.mark.parametrize("col", [0, 1])
def test_first_set_column_of_a_packed_window(col):
    # Every nonempty set of key (col 0) or value (col 1) columns of a window's flat bools,
    # with noise in the other columns, which must not count.
    sets = np.array([r for r in itertools.product([False, True], repeat=keymap.WINDOW)
                     if any(r)], bool)
    flat = np.random.default_rng(15).random((len(sets), 2 * keymap.WINDOW)) < 0.5
    flat[:, col::2] = sets
    packed = flat.reshape(-1).view(np.uint64)
    packed = packed & keymap._KEY_COLS if col == 0 else keymap._value_cols(packed)
    assert keymap._first(packed, flat.reshape(-1), np.arange(len(sets)), col).tolist() \
        == sets.argmax(axis=1).tolist()


def test_key_index_survives_chains_that_reach_the_padding():
    # Keys that all hash to the last home positions: their chains run into the padding, so
    # the index must grow (or re-place) rather than lose or misplace any of them.
    ix = KeyIndex()
    cand = rand_keys(np.random.default_rng(13), 400_000)
    homes = ix._home(cand)
    crowd = cand[homes >= ix.size - 4][:300]
    assert len(crowd) > keymap.PAD
    ix.insert(crowd, np.arange(len(crowd)))
    assert ix.get(crowd).tolist() == list(range(len(crowd)))
    assert len(ix) == len(crowd) and (ix.vals[-keymap.WINDOW:] == keymap.EMPTY).all()


def test_key_index_places_crowds_of_keys_that_share_home_positions():
    # Hundreds of keys of one insert on a few homes, around tombstones of earlier keys: they
    # take the free positions of their chain in turn, each still found where it landed.
    ix = KeyIndex(4096)
    cand = rand_keys(np.random.default_rng(18), 400_000)
    homes = ix._home(cand)
    crowd = cand[(homes >= 100) & (homes < 106)]
    assert len(crowd) >= 350
    first, second = crowd[:150], crowd[150:350]
    ix.insert(first, np.arange(150))
    ix.remove_at(ix.find(first[::2])[1])
    ix.insert(second, np.arange(150, 350))
    assert ix.size == 4096 and len(ix) == 75 + 200
    assert ix.get(first[1::2]).tolist() == list(range(1, 150, 2))
    assert ix.get(second).tolist() == list(range(150, 350))
    assert (ix.get(first[::2]) == -1).all()
    k, v = ix.items()
    assert sorted(v.tolist()) == list(range(1, 150, 2)) + list(range(150, 350))
    assert ix.deleted == np.count_nonzero(ix.vals == keymap.DELETED) < 75


def test_key_index_keeps_every_key_of_an_insert_whose_chain_runs_into_the_padding():
    # Two crowds in one insert: one at the last home positions runs into the padding while
    # the other, mid-index, still has keys to place; all of them must end up in the index.
    ix = KeyIndex(4096)
    cand = rand_keys(np.random.default_rng(17), 400_000)
    homes = ix._home(cand)
    end, mid = cand[homes >= ix.size - 4][:300], cand[(homes >= 100) & (homes < 104)][:300]
    keys = np.concatenate([end, mid])
    ix.insert(keys, np.arange(len(keys)))
    assert ix.size > 4096 and len(ix) == len(keys)
    assert ix.get(keys).tolist() == list(range(len(keys)))


def test_key_index_finds_keys_along_chains_that_run_to_the_padding_end():
    # One chain from the last home positions up to the EMPTY tail: lookups that go on past
    # the first window, to the windows that must stay inside the arrays, live or absent keys,
    # past tombstones.
    ix = KeyIndex()
    cand = rand_keys(np.random.default_rng(16), 400_000)
    crowd = cand[ix._home(cand) >= ix.size - 4]
    inside, absent = crowd[:keymap.PAD], crowd[keymap.PAD:keymap.PAD + 300]
    ix.insert(inside, np.arange(len(inside)))
    assert ix.size == 1024 and ix.vals[ix.size + keymap.PAD - keymap.WINDOW - 1] >= 0
    assert ix.get(inside).tolist() == list(range(len(inside)))
    assert (ix.get(absent) == -1).all()
    vals, where = ix.find(np.concatenate([inside[::-1], absent]))
    assert (ix.keys[where[:len(inside)]] == inside[::-1]).all()
    assert (where[len(inside):] == -1).all() and (vals[len(inside):] == -1).all()
    ix.remove_at(ix.find(inside[::3])[1])
    expect = np.arange(len(inside))
    expect[::3] = -1
    assert ix.get(inside).tolist() == expect.tolist()


@pytest.mark.parametrize("kw", [dict(), dict(admit_after=2, candidates=300),
                                dict(capacity=60, evict="lfu", evict_fraction=0.1),
                                dict(memo_bytes=200)])
def test_a_push_after_a_pull_of_its_keys_gives_the_table_of_a_push_alone(kw, monkeypatch):
    # Table a pushes after pulling (the pull's lookups and initial rows may be reused), b
    # forgets what its pulls found; between them: keys changed in place after the pull,
    # another pull, a restore, the pulled rows changed by the caller. memo_bytes: a pull
    # keeps no rows past that many bytes (only its lookups).
    monkeypatch.setattr(sparse_table, "MEMO_BYTES", kw.pop("memo_bytes", sparse_table.MEMO_BYTES))
    rng = np.random.default_rng(19)
    a, b = SparseTable(4, seed=3, **kw), SparseTable(4, seed=3, **kw)
    for step in range(80):
        keys = zipf_keys(rng, int(rng.integers(1, 300)), alpha=1.1, space=3000)
        grads = rng.standard_normal((len(keys), 4)).astype(F32)
        if step % 5 == 0:
            earlier = a.snapshot()
        for t in (a, b):
            out = t.pull(keys)
            out += 1.0
            if step % 5 == 2:
                t.pull(keys[: len(keys) // 2])
            if step % 5 == 3:
                t.restore(earlier)
        b._memo = None
        if step % 5 == 1:
            keys[: len(keys) // 2] = zipf_keys(rng, len(keys) // 2, alpha=1.1, space=3000)
        for t in (a, b):
            t.push(keys, grads, scale=0.5)
        assert snapshots_equal(a.snapshot(), b.snapshot()), step
    probe = zipf_keys(rng, 500, space=3000)
    np.testing.assert_array_equal(a.pull(probe), b.pull(probe))
    assert a.counters() == b.counters() and a.counters()["created"] > 100


def test_push_and_pull_leave_the_callers_arrays_alone():
    rng = np.random.default_rng(14)
    t = SparseTable(4, capacity=50)
    for _ in range(5):
        keys = zipf_keys(rng, 64, space=100)
        grads = rng.standard_normal((64, 4)).astype(F32)
        k0, g0 = keys.copy(), grads.copy()
        t.push(keys, grads, scale=2.0)
        out = t.pull(keys)
        out += 1.0                       # the pulled rows are a copy, not the table
        assert np.array_equal(keys, k0) and np.array_equal(grads, g0)
    assert not np.array_equal(t.pull(keys), out)
    # Strided keys and grads (slices, Fortran order) are taken as they are.
    keys = zipf_keys(rng, 128, space=100)
    grads = np.asfortranarray(rng.standard_normal((64, 4)).astype(F32))
    u = SparseTable(4, capacity=50)
    t.restore(u.snapshot())
    t.push(keys[::2], grads)
    u.push(keys[::2].copy(), np.ascontiguousarray(grads))
    assert snapshots_equal(t.snapshot(), u.snapshot())
    np.testing.assert_array_equal(t.pull(keys[1::2]), u.pull(keys[1::2].copy()))


@pytest.mark.parametrize("optimizer,admit_after", [("adagrad", 1), ("sgd", 2)])
def test_duplicates_summed_by_the_client_leave_the_table_bit_for_bit_as_summed_by_it(
        optimizer, admit_after):
    """A client sums a push's duplicate keys before sending (client/rows.py): the table must
    end exactly as when it summed them itself, admission counts and scaled updates included,
    for a pull-then-push batch (the table reuses the pull) and a push alone."""
    from paramserver.sparse.groups import KeyGroup, sum_duplicates
    rng = np.random.default_rng(7)
    kw = dict(optimizer=optimizer, lr=0.05, capacity=60, admit_after=admit_after)
    itself, summed = SparseTable(4, **kw), SparseTable(4, **kw)
    for step in range(40):
        keys = zipf_keys(rng, 64, space=500)
        grads = rng.standard_normal((keys.size, 4)).astype(np.float32)
        group = KeyGroup(keys)
        assert group.uniq.size < keys.size  # Zipf: duplicates in every batch
        if step % 2:
            # the client asks for each distinct key once and copies rows to duplicates
            np.testing.assert_array_equal(itself.pull(keys),
                                          summed.pull(group.uniq)[group.inverse()])
        itself.push(keys, grads, scale=0.5)
        summed.push(group.uniq, sum_duplicates(group, grads), scale=0.5)
    a, b = itself.snapshot(), summed.snapshot()
    assert a.keys() == b.keys()
    # every array, the counters of keys as sent aside (the client sends fewer)
    sent = [2 + sparse_table.COUNTERS.index(c) for c in ("pulled_keys", "pushed_keys")]
    for state in (a, b):
        state["state"] = np.delete(state["state"], sent)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    ca, cb = itself.counters(), summed.counters()
    for name in ("created", "updated", "evicted", "not_admitted", "admitted"):
        assert ca[name] == cb[name], name
    assert ca["evicted"] > 0 and ca["created"] > 0
