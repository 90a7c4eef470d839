"""Where a client sends a batch's rows: each key to shard_of(key) and nowhere else, for any
shard count, and a push of the keys just pulled follows the shard count in force when it is
sent (a reshard between the pull and the push), though it reuses the pull's grouping.

No sockets: the requests are recorded where ShardRequests would send them.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from paramserver.client.core.worker_core import WorkerCore
from paramserver.client.rows import RowTables
from paramserver.sparse.placement import shard_of
from paramserver.spec.job import TableSpec

DIM = 3


class Sent:
    """ShardRequests' send, recorded: (shard, message) in order."""

    def __init__(self):
        self.log: list[tuple[int, object]] = []

    def send(self, shard: int, msg) -> int:
        self.log.append((shard, msg))
        return len(self.log)


def tables(shards: int) -> tuple[RowTables, Sent, SimpleNamespace]:
    core = WorkerCore()
    core.versions = [0] * 64
    sent = Sent()
    shard_map = SimpleNamespace(shards=list(range(shards)), before_request=lambda: None)
    rows = RowTables([TableSpec(name="emb", dim=DIM)], core, sent, shard_map, wait=None)
    return rows, sent, shard_map


def by_shard(log) -> dict[int, np.ndarray]:
    out: dict[int, list] = {}
    for shard, msg in log:
        out.setdefault(shard, []).append(np.asarray(msg.arrays[0]))
    return {s: np.concatenate(k) for s, k in out.items()}


def expected(keys: np.ndarray, shards: int) -> dict[int, np.ndarray]:
    uniq = np.unique(keys)
    owner = shard_of(uniq, shards)
    return {s: uniq[owner == s] for s in range(shards) if (owner == s).any()}


def batch(seed: int, n: int = 500) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.zipf(1.2, n) * 7919 - 2**40).astype(np.int64)  # repeats, negative ids too


@pytest.mark.parametrize("shards", [1, 2, 3, 16, 17, 40])
def test_each_key_of_a_pull_and_its_push_goes_to_its_shard_once(shards):
    rows, sent, _ = tables(shards)
    keys = batch(shards)
    rows.pull_async("emb", keys)
    pulled = by_shard(sent.log)
    want = expected(keys, shards)
    assert pulled.keys() == want.keys()
    for s in want:
        np.testing.assert_array_equal(pulled[s], want[s])
    sent.log.clear()
    rows.push_async("emb", keys, np.ones((keys.size, DIM), np.float32), step=0, batch=1)
    pushed = by_shard(sent.log)
    assert pushed.keys() == want.keys()
    for s in want:
        np.testing.assert_array_equal(pushed[s], want[s])


@pytest.mark.parametrize("distinct", [False, True])
def test_a_push_after_a_reshard_goes_by_the_new_shard_count(distinct):
    rows, sent, shard_map = tables(2)
    keys = np.unique(batch(5)) if distinct else batch(5)
    rows.pull_async("emb", keys)
    np.testing.assert_array_equal(np.sort(np.concatenate(list(by_shard(sent.log).values()))),
                                  np.unique(keys))
    shard_map.shards = list(range(5))  # a server joined twice over between pull and push
    sent.log.clear()
    rows.push_async("emb", keys, np.ones((keys.size, DIM), np.float32), step=0, batch=1)
    pushed = by_shard(sent.log)
    want = expected(keys, 5)
    assert pushed.keys() == want.keys()
    for s in want:
        np.testing.assert_array_equal(pushed[s], want[s])
    # and a pull of the same keys afterwards, too
    sent.log.clear()
    rows.pull_async("emb", keys)
    assert by_shard(sent.log).keys() == want.keys()
