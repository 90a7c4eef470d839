"""Rows of sparse tables changing shards (sparse/moves.py): checked against one table that
was never sharded, which every push reached whole."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramserver.sparse.moves import RowBundle, gather, split
from paramserver.sparse.placement import shard_of
from paramserver.sparse.table import SparseTable, TableError

DIM = 3


def _table(capacity=10_000, **kw) -> SparseTable:
    return SparseTable(DIM, capacity=capacity, lr=0.1, **kw)


def _push(tables: list[SparseTable], keys: np.ndarray, grads: np.ndarray) -> None:
    """One push of a client: each shard gets its keys' part (every shard hears, as in a
    round, so each table's clock counts the same pushes)."""
    owner = shard_of(keys, len(tables))
    for i, t in enumerate(tables):
        t.push(keys[owner == i], grads[owner == i])


def _reshard(tables: list[SparseTable], n: int, make) -> list[SparseTable]:
    """Every table split by the new count's placement, each new shard gathered from all."""
    parts = [split(t, lambda k: shard_of(k, n)) for t in tables]
    new = []
    for rank in range(n):
        t = make()
        gather(t, [p[rank] for p in parts if rank in p], None)
        new.append(t)
    return new


batches = st.lists(st.lists(st.integers(-40, 40), min_size=0, max_size=12), min_size=1,
                   max_size=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=batches, after=batches, counts=st.sampled_from([(1, 3), (2, 3), (3, 2), (3, 1)]),
       optimizer=st.sampled_from(["adagrad", "sgd"]), admit_after=st.sampled_from([1, 2, 3]))
def test_resharded_tables_read_and_train_as_one_table_that_never_moved(
        before, after, counts, optimizer, admit_after):
    make = lambda: _table(optimizer=optimizer, admit_after=admit_after)  # noqa: E731
    reference = make()
    shards = [make() for _ in range(counts[0])]
    rng = np.random.default_rng(len(before) + 7 * len(after))

    def run(batch_list, tables):
        for batch in batch_list:
            keys = np.array(batch, np.int64)
            grads = rng.standard_normal((len(keys), DIM)).astype(np.float32)
            reference.push(keys, grads)
            _push(tables, keys, grads)

    run(before, shards)
    shards = _reshard(shards, counts[1], make)
    every = np.arange(-40, 41, dtype=np.int64)
    owner = shard_of(every, counts[1])
    for i, t in enumerate(shards):  # each key on its new shard, exact
        mine = every[owner == i]
        np.testing.assert_array_equal(t.pull(mine), reference.pull(mine))
    run(after, shards)  # admission counts and accumulators went along: training goes on alike
    for i, t in enumerate(shards):
        mine = every[owner == i]
        np.testing.assert_array_equal(t.pull(mine), reference.pull(mine))
    assert sum(len(t) for t in shards) == len(reference)


def test_a_smaller_share_keeps_the_rows_its_eviction_rule_would():
    src = _table(capacity=100)
    for tick, key in enumerate(range(10)):  # key k last pushed at tick k+1, pushed k+1 times
        for _ in range(key + 1 if key < 5 else 1):
            src.push(np.array([key], np.int64), np.ones((1, DIM), np.float32))
    (bundle,) = split(src, lambda k: np.zeros(len(k), np.int64)).values()
    lru = _table(capacity=4)
    assert gather(lru, [bundle], src.counters()) == 6
    assert sorted(lru.snapshot()["keys"].tolist()) == [6, 7, 8, 9]  # the most recent
    assert lru.counters()["evicted"] == 6 and lru.counters()["created"] == 10
    lfu = _table(capacity=4, evict="lfu")
    gather(lfu, [bundle], None)
    assert sorted(lfu.snapshot()["keys"].tolist()) == [1, 2, 3, 4]  # the most pushed
    np.testing.assert_array_equal(lfu.pull(np.array([4], np.int64)),
                                  src.pull(np.array([4], np.int64)))


def test_ages_survive_tables_with_different_clocks():
    busy, quiet = _table(), _table()
    for _ in range(50):
        busy.push(np.array([1], np.int64), np.ones((1, DIM), np.float32))
    quiet.push(np.array([2], np.int64), np.ones((1, DIM), np.float32))  # age 0 at tick 1
    busy.push(np.array([3], np.int64), np.ones((1, DIM), np.float32))  # age 0 at tick 51
    one = lambda k: np.zeros(len(k), np.int64)  # noqa: E731
    merged = _table(capacity=2)
    gather(merged, [split(busy, one)[0], split(quiet, one)[0]], None)
    # Key 1 is one push old on its table, keys 2 and 3 were just pushed: 1 goes.
    assert sorted(merged.snapshot()["keys"].tolist()) == [2, 3]


def test_a_key_from_two_shards_is_refused_and_the_table_unchanged():
    a, b = _table(), _table()
    for t in (a, b):
        t.push(np.array([5], np.int64), np.ones((1, DIM), np.float32))
    one = lambda k: np.zeros(len(k), np.int64)  # noqa: E731
    target = _table()
    target.push(np.array([9], np.int64), np.ones((1, DIM), np.float32))
    before = target.snapshot()
    with pytest.raises(TableError, match="two shards"):
        gather(target, [split(a, one)[0], split(b, one)[0]], None)
    assert target.snapshot()["keys"].tolist() == before["keys"].tolist()


def test_bundles_cross_the_wire_in_pieces_and_are_checked():
    src = _table(admit_after=2)
    keys = np.arange(20, dtype=np.int64)
    for _ in range(2):
        src.push(keys[:12], np.ones((12, DIM), np.float32))
    src.push(keys[12:], np.ones((8, DIM), np.float32))  # 8 candidates, 12 rows
    (bundle,) = split(src, lambda k: np.zeros(len(k), np.int64)).values()
    pieces = bundle.pieces(5)
    assert [p.items for p in pieces] == [5, 5, 2, 5, 3]
    back = [RowBundle.from_frames(p.tick, p.frames(), DIM, True) for p in pieces]
    target = _table(admit_after=2)
    gather(target, back, src.counters())
    np.testing.assert_array_equal(target.pull(keys), src.pull(keys))
    target.push(keys[12:], np.ones((8, DIM), np.float32))  # the second push admits them
    src.push(keys[12:], np.ones((8, DIM), np.float32))
    np.testing.assert_array_equal(target.pull(keys), src.pull(keys))
    assert RowBundle.empty(DIM, True).pieces(5) and len(RowBundle.empty(DIM, True).pieces(5)) == 1
    frames = bundle.frames()
    with pytest.raises(TableError, match="8 arrays"):
        RowBundle.from_frames(0, frames[:-1], DIM, True)
    bad = list(frames)
    bad[1] = bad[1].copy()
    bad[1][0] = np.nan
    with pytest.raises(TableError, match="finite"):
        RowBundle.from_frames(0, bad, DIM, True)
    bad = list(frames)
    bad[3] = -bad[3] - 1
    with pytest.raises(TableError, match="negative"):
        RowBundle.from_frames(0, bad, DIM, True)
    with pytest.raises(TableError, match="rows"):
        RowBundle.from_frames(0, [frames[0], frames[1][:-1], *frames[2:]], DIM, True)
