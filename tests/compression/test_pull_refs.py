"""The shard's pull references (server/deltas.py): what a worker that stopped pulling still
holds there is freed, and room is made beyond the cap, without breaking the workers that
stay."""

import numpy as np

from paramserver.compression import make_codec, payload
from paramserver.server import deltas
from paramserver.server.core import ShardCore
from paramserver.server.deltas import IDLE_SWEEPS, PullRefs
from paramserver.server.events import Init, Pull, Push, Reply, Restore, ShardSettings, Then

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


# ---- one encode per step, shared by the workers whose references are equal ------------------

def _apply(copy: np.ndarray, reply, lo: int, hi: int) -> None:
    """What a worker does with a reply: a dense one replaces its copy, a delta is added."""
    fields, frames = reply
    if "enc" in fields:
        copy[lo:hi] += payload.unpack(fields, frames, hi - lo)
    else:
        copy[lo:hi] = frames[0]


def test_four_workers_pulling_one_round_cost_one_encode():
    refs = PullRefs(0, 8)
    rng = np.random.default_rng(0)
    v1 = rng.standard_normal(8).astype(np.float32)
    copies = {s: np.zeros(8, np.float32) for s in "abcd"}
    for s in "abcd":  # the refresh: one tag for all
        _apply(copies[s], refs.dense(s, 1, 0, 8, v1, HEAD, version=1), 0, 8)
    v2 = v1 + rng.standard_normal(8).astype(np.float32) * np.float32(0.01)
    replies = [refs.delta(s, 2, 0, 8, v2, make_codec("uniform8"), HEAD, version=2) for s in "abcd"]
    assert (refs.encodes, refs.shared) == (1, 3 + 3)
    assert all(r[1][0] is replies[0][1][0] for r in replies)  # the same frames, not copies
    for s, reply in zip("abcd", replies):
        _apply(copies[s], reply, 0, 8)
        np.testing.assert_array_equal(copies[s], refs._refs[s].values)
    # unshared, each worker's reply would have been the same bytes
    alone = PullRefs(0, 8)
    alone.dense("x", 1, 0, 8, v1, HEAD)
    fields, frames = alone.delta("x", 2, 0, 8, v2, make_codec("uniform8"), HEAD)
    assert fields == replies[0][0] and bytes(frames[0]) == bytes(replies[0][1][0])
    assert refs.step_bytes == 0  # every worker took the step: none is kept


def test_shared_steps_leave_every_reply_and_reference_as_unshared_ones_would():
    """Rounds of chunked pulls by workers that skip rounds, start late, are forgotten and
    refresh: one encode per distinct reference, every reply bit for bit the one an unshared
    shard sends, and each worker's copy what the shard thinks it holds."""
    rng = np.random.default_rng(7)
    n, codecs = 12, ["uniform8", "bf16", "fp16"]
    shared, alone = PullRefs(100, n), PullRefs(100, n)
    workers = ["w0", "w1", "w2", "w3"]
    copies = {s: np.zeros(n, np.float32) for s in workers}
    values = rng.standard_normal(n).astype(np.float32)
    distinct = set()  # the delta pulls of distinct references: one encode each is enough
    for version in range(1, 40):
        values = values + rng.standard_normal(n).astype(np.float32) * np.float32(0.05)
        codec = codecs[version % 3 if version % 10 else 0]
        cuts = [0, n] if version % 4 else [0, 5, 9, n]
        refresh = version % 10 == 5
        if version == 20:
            shared.forget("w2"), alone.forget("w2")
        for s in workers:
            if (s == "w3" and version < 5) or (s == "w1" and version % 3 == 0):
                continue
            for i, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
                rid, head = 10 * version + i, {"version": version}
                args = (s, rid, 100 + lo, 100 + hi, values[lo:hi])
                if refresh:
                    got = shared.dense(*args, head, version)
                    want = alone.dense(*args, head)
                else:
                    held = alone._refs.get(s)
                    if held is not None and held.known[lo:hi].all():  # an encode is due
                        distinct.add((held.values.tobytes(), lo, hi, version, codec))
                    got = shared.delta(*args, make_codec(codec), head, version)
                    want = alone.delta(*args, make_codec(codec), head)
                assert got[0] == want[0]
                assert [bytes(f) for f in got[1]] == [bytes(f) for f in want[1]]
                _apply(copies[s], got, lo, hi)
            np.testing.assert_array_equal(copies[s], shared._refs[s].values)
            np.testing.assert_array_equal(shared._refs[s].values, alone._refs[s].values)
    assert shared.encodes == len(distinct) < alone.encodes / 2, (shared.encodes, alone.encodes)
    assert shared.step_bytes <= deltas.MAX_STEP_KEYS * 4 * n


def test_values_replaced_at_the_same_version_are_not_answered_by_an_old_step():
    """A restore may bring other values at the version the shard had: a step kept from before
    must not answer a pull after."""
    refs = PullRefs(0, 4)
    v1 = np.ones(4, np.float32)
    for s in "ab":
        refs.dense(s, 1, 0, 4, v1, HEAD, version=1)
    codec = make_codec("bf16")
    refs.delta("a", 2, 0, 4, v1 * 2, codec, HEAD, version=2)  # kept for b
    refs.values_replaced()  # a restore: the values are now v1 * 3, still "version 2"
    fields, frames = refs.delta("b", 2, 0, 4, v1 * 3, codec, HEAD, version=2)
    copy = v1 + payload.unpack(fields, frames, 4)
    np.testing.assert_array_equal(copy, v1 * 3)
    assert refs.encodes == 2 and refs.shared == 1  # (the refresh's dense step only)


def test_a_shard_core_encodes_one_delta_for_a_round_of_four_waiting_pulls():
    """Through ShardCore: four workers' delta pulls waiting for a round are answered with the
    same frames by one encode; after a restore that keeps the version, the next pull is
    encoded anew from the restored values."""
    n, workers = 6, ["w0", "w1", "w2", "w3"]
    c = ShardCore(ShardSettings(rank=0, lo=0, hi=n, dtype="float32", apply_mode="round",
                                optimizer="sgd", lr=0.5))
    c.handle(Init("i", 0, n, np.linspace(-1, 1, n, dtype=np.float32)))
    rid = iter(range(1, 1000))

    def pull(s, version, delta=True):
        return Pull(("c", s), 0.0, version, 0, n, client=s, ref=True, sender=s, rid=next(rid),
                    delta=make_codec("uniform8") if delta else None)

    copies = {}
    for s in workers:
        copies[s] = c.handle(pull(s, 0, delta=False))[0].arrays[0].copy()
    for s in workers:
        assert not c.handle(pull(s, 1))  # waits for the round
    out = []
    for k, s in enumerate(workers):
        out += c.handle(Push(("c", s), s, next(rid), 0, n, np.full(n, k, np.float32), 0, 1, 0,
                             1.0, len(workers)))
    out += [r for t in out if type(t) is Then for r in c.handle(t.event)]
    replies = [r for r in out if type(r) is Reply and r.op == "values"]
    assert len(replies) == 4 and c.refs.encodes == 1
    assert all(r.arrays[0] is replies[0].arrays[0] for r in replies)
    for s, r in zip(workers, replies):
        copies[s] += payload.unpack(r.fields, r.arrays, n)
        np.testing.assert_array_equal(copies[s], c.refs._refs[s].values)
    arrays, meta = c.store.snapshot()
    arrays = {k: v.copy() for k, v in arrays.items()}
    c.handle(pull("w0", 1))  # the version's step, kept for the others ...
    arrays["values"] += np.float32(1)
    c.handle(Restore("t", arrays, meta))  # ... is not theirs after other values at version 1
    r = c.handle(pull("w1", 1))[0]
    copies["w1"] += payload.unpack(r.fields, r.arrays, n)
    assert c.refs.encodes == 3
    np.testing.assert_allclose(copies["w1"], c.store.values.numpy(), atol=0.02)
