"""The shard's pull references (server/deltas.py): what a worker that stopped pulling still
holds there is freed, and room is made beyond the cap, without breaking the workers that
stay."""

import numpy as np

from paramserver.compression import make_codec
from paramserver.server import deltas
from paramserver.server.deltas import IDLE_SWEEPS, PullRefs

HEAD = {"version": 1, "range": [0, 8]}


def _round(refs: PullRefs, senders, rid: int, values) -> list:
    """Each sender's delta pull of the whole shard (the first of each comes dense)."""
    return [refs.delta(s, rid, 0, 8, values, make_codec("bf16"), HEAD) for s in senders]


def test_a_worker_that_stops_pulling_is_freed_and_the_others_keep_theirs():
    refs = PullRefs(0, 8)
    v = np.linspace(0, 1, 8, dtype=np.float32)
    _round(refs, ["w0", "w1", "w2", "w3"], 1, v)
    assert refs.workers == 4 and refs.nbytes == 4 * 8 * 5
    # w3 leaves; w1 pulls every third round (a straggler), the others every round
    rounds = 0
    while refs.workers == 4:
        rounds += 1
        assert rounds <= 2 * IDLE_SWEEPS, "w3 was never freed"
        _round(refs, ["w0", "w2"] + (["w1"] if rounds % 3 == 0 else []), 1 + rounds, v)
    assert refs.answered("w3", 1) is None  # its kept replies went too
    assert (refs.workers, refs.freed) == (3, 1)
    # the three that stay still get deltas (a payload with a codec), not dense replies
    v2 = v + np.float32(0.25)
    fields = [f for f, _ in _round(refs, ["w0", "w1", "w2"], 1000, v2)]
    assert all("enc" in f for f in fields), fields
    # w3 comes back: answered dense, which replaces its copy
    fields, frames = refs.delta("w3", 1001, 0, 8, v2, make_codec("bf16"), HEAD)
    assert "enc" not in fields
    np.testing.assert_array_equal(frames[0], v2)


def test_sub_range_pulls_count_once_per_sweep():
    """A whole-model pull in several messages is one sweep: chunks after the first do not age
    the others faster."""
    refs = PullRefs(0, 8)
    v = np.zeros(8, np.float32)
    refs.dense("a", 0, 0, 8, v, HEAD)
    refs.dense("b", 0, 0, 8, v, HEAD)
    for rid in range(1, 4 * IDLE_SWEEPS):  # b pulls in 4 chunks, a never again
        for part in range(4):
            refs.dense("b", 4 * rid + part, 2 * part, 2 * part + 2, v[:2], HEAD)
        if refs.workers == 1:
            break
    # a is forgotten once IDLE_SWEEPS x 2 (held) sweeps passed since its pull (not 4x sooner)
    assert refs.workers == 1 and rid == 2 * IDLE_SWEEPS


def test_beyond_the_cap_the_least_recently_served_makes_room(monkeypatch):
    monkeypatch.setattr(deltas, "MAX_WORKERS", 3)
    refs = PullRefs(0, 8)
    v = np.ones(8, np.float32)
    for s in ["a", "b", "c"]:
        refs.dense(s, 0, 0, 8, v, HEAD)
    refs.dense("a", 1, 0, 8, v, HEAD)  # a is served again: b is now the oldest
    refs.dense("d", 0, 0, 8, v, HEAD)  # once refused; now b is forgotten
    assert refs.workers == 3 and refs.freed == 1
    fields, _ = refs.delta("b", 1, 0, 8, v, make_codec("bf16"), HEAD)
    assert "enc" not in fields  # b is answered dense
