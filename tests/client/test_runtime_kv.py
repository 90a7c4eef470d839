"""The KV API against real shards: ranges and sparse keys across shard boundaries, async handles."""

import numpy as np
import pytest

from paramserver.net.rpc import RemoteError
from paramserver.client.kv import KVWorker
from ps_helpers import make_job, running_job

NUM_KEYS = 100  # three shards: [0, 34), [34, 67), [67, 100)


@pytest.fixture(scope="module")
def kv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv")
    with running_job(tmp, make_job(NUM_KEYS, 3, 1, sync="asp", lr=1.0)) as cluster:
        client = KVWorker(cluster.address)
        client.init(np.arange(NUM_KEYS, dtype=np.float64))
        client.start()
        yield client
        client.close()


def test_shard_map_covers_the_key_space(kv):
    ranges = [(s.range.lo, s.range.hi) for s in kv.shards]
    assert ranges == [(0, 34), (34, 67), (67, 100)]


def test_range_pull_across_boundaries_returns_exactly_those_keys(kv):
    current = kv.pull()
    for lo, hi in [(0, 100), (30, 70), (33, 34), (34, 35), (66, 68), (99, 100), (10, 10)]:
        np.testing.assert_array_equal(kv.pull((lo, hi)), current[lo:hi])


def test_range_push_touches_only_its_keys(kv):
    before = kv.pull()
    kv.push(np.ones(40), (30, 70), step=0, batch=1)
    after = kv.pull()
    expected = before.copy()
    expected[30:70] -= 1
    np.testing.assert_array_equal(after, expected)


def test_sparse_push_and_pull_across_shards_unsorted_with_repeats(kv):
    before = kv.pull()
    keys = np.array([99, 0, 33, 34, 66, 67, 33], dtype=np.int64)
    vals = np.array([1, 2, 3, 4, 5, 6, 7], dtype=np.float64)
    kv.push_sparse(keys, vals, step=0, batch=1)
    expected = before.copy()
    np.add.at(expected, keys, -vals)
    np.testing.assert_array_equal(kv.pull(), expected)
    np.testing.assert_array_equal(kv.pull_keys(keys), expected[keys])


def test_async_handles_complete_in_any_order(kv):
    before = kv.pull()
    h1 = kv.push_async(np.full(10, 2.0), (0, 10), step=0, batch=1)
    h2 = kv.pull_async((50, 60))
    h3 = kv.push_async(np.full(10, 3.0), (90, 100), step=0, batch=1)
    np.testing.assert_array_equal(kv.wait(h2), before[50:60])
    kv.wait(h3)
    kv.wait(h1)
    after = kv.pull()
    np.testing.assert_array_equal(after[:10], before[:10] - 2)
    np.testing.assert_array_equal(after[90:], before[90:] - 3)


def test_client_side_errors_are_clear(kv):
    with pytest.raises(ValueError, match="exceeds"):
        kv.pull((90, 101))
    with pytest.raises(ValueError, match="dtype"):
        kv.push(np.ones(NUM_KEYS, dtype=np.float32), step=0, batch=1)
    with pytest.raises(ValueError, match="keys"):
        kv.push_sparse(np.array([100]), np.ones(1), step=0, batch=1)


def test_keys_that_are_not_integers_are_refused_not_truncated(kv):
    before = kv.pull()
    with pytest.raises(ValueError, match="keys must be integers; got an array of float64"):
        kv.push_sparse(np.array([1.5, 2.0]), np.ones(2), step=0, batch=1)
    with pytest.raises(ValueError, match="keys must be integers"):
        kv.pull_keys([0.5])
    np.testing.assert_array_equal(kv.pull(), before)  # key 1 was not touched
    np.testing.assert_array_equal(kv.pull_keys(np.array([3], dtype=np.uint32)), before[[3]])
    assert kv.pull_keys([]).shape == (0,)


def test_wait_on_something_else_than_a_handle_is_a_type_error(kv):
    with pytest.raises(TypeError, match="wait takes the Handle a push_async or pull_async "
                                        "returned; got int"):
        kv.wait(12345)


def test_a_closed_client_says_so(tmp_path):
    with running_job(tmp_path, make_job(10, 1, 1, sync="asp", lr=1.0)) as cluster:
        client = KVWorker(cluster.address)
        client.init(np.zeros(10))
        client.start()
        client.close()
        client.close()  # a second close does nothing
        for call in (lambda: client.push(np.ones(10), step=1, batch=1), client.pull,
                     lambda: client.clock(1, batch=1, compute_time=0.0)):
            with pytest.raises(RuntimeError, match="this client is closed"):
                call()


def test_server_refuses_a_range_outside_its_shard(kv):
    from paramserver.wire import Message
    rid = kv.requests.send(0, Message("pull", {"range": [30, 40]}))
    with pytest.raises(RemoteError, match="outside"):
        kv.requests.collect([(0, rid, slice(0, 10))], "pull")
    np.testing.assert_array_equal(kv.pull((0, 5)).shape, (5,))  # and it still serves us
