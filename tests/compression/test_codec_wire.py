"""Codec-encoded values on the live wire (issue 22): pushes decode to float32 on real shards,
chunked or not, and a malformed or lying payload is refused while the shard goes on serving."""

import numpy as np
import pytest

from paramserver.client.kv import KVWorker
from paramserver.compression import make_codec, payload
from paramserver.net.rpc import RemoteError
from paramserver.wire import Message
from ps_helpers import make_job, running_job

NUM_KEYS = 300  # two shards of 150; 64-value chunks, so a whole push goes in several
CHUNK = 256


@pytest.fixture(scope="module")
def kv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("codec_wire")
    job = make_job(NUM_KEYS, 2, 1, sync="asp", dtype="float32", lr=1.0, chunk_bytes=CHUNK,
                   tcp_chunk_bytes=CHUNK, chunks_in_flight=2, tcp_chunks_in_flight=2)
    with running_job(tmp, job) as cluster:
        client = KVWorker(cluster.address)
        client.init(np.zeros(NUM_KEYS, dtype=np.float32))
        client.start()
        yield client
        client.close()


def _chunk_decoded(codec, grad: np.ndarray) -> np.ndarray:
    """What the shards add for a whole-key push: each chunk of each shard encoded alone."""
    per = CHUNK // 4
    out = np.empty_like(grad)
    for lo in range(0, NUM_KEYS, NUM_KEYS // 2):
        for a in range(lo, lo + NUM_KEYS // 2, per):
            b = min(a + per, lo + NUM_KEYS // 2)
            out[a:b] = codec.decode(codec.encode(grad[a:b]), b - a)
    return out


def test_fp16_pushes_of_integer_gradients_sum_exactly(kv):
    rng = np.random.default_rng(0)
    before = kv.pull().copy()
    grads = [rng.integers(-1000, 1000, NUM_KEYS).astype(np.float32) for _ in range(4)]
    fp16 = make_codec("fp16")
    for g in grads:
        handle = kv.push_async(g, step=0, batch=1, codec=fp16)
        kv.wait(handle)
        assert handle.nbytes == NUM_KEYS * 2  # two bytes a value, chunked or not
    expected = before - np.sum(grads, axis=0, dtype=np.float32)
    np.testing.assert_array_equal(kv.pull(), expected)


@pytest.mark.parametrize("name", ["bf16", "uniform8", "quantile8"])
def test_a_codec_push_adds_what_its_chunks_decode_to(kv, name):
    rng = np.random.default_rng(1)
    g = rng.standard_normal(NUM_KEYS).astype(np.float32)
    before = kv.pull().copy()
    kv.push(g, step=0, batch=1, codec=make_codec(name))
    sent = _chunk_decoded(make_codec(name), g)
    np.testing.assert_allclose(kv.pull(), before - sent, rtol=0, atol=1e-5)
    if name != "quantile8":  # (its 256-entry codebook holds a 64-value chunk exactly)
        assert np.abs(sent - g).max() > 0  # lossy: the check above is not a dense push's


def test_a_mixed_push_keeps_its_runs_exact_across_chunks_and_shards(kv):
    """`mixed` (what --compress auto pushes): the runs, here crossing a chunk's and the
    shards' borders, arrive float32; each chunk's slice of them is placed by part()."""
    rng = np.random.default_rng(5)
    g = rng.standard_normal(NUM_KEYS).astype(np.float32)
    runs = ((10, 20), (60, 70), (140, 160), (299, 300))
    before = kv.pull().copy()
    sent = np.empty(NUM_KEYS, np.float32)
    codec = make_codec("mixed", inner="uniform8").dense_runs(runs)
    handle = kv.push_async(g, step=0, batch=1, codec=codec, sent=sent)
    kv.wait(handle)
    np.testing.assert_allclose(kv.pull(), before - sent, rtol=0, atol=1e-5)  # shards: `sent`
    for a, b in runs:
        np.testing.assert_allclose(sent[a:b], g[a:b], rtol=0, atol=0)
    assert np.abs(sent - g).max() > 0  # the rest went as uniform8
    dense = sum(b - a for a, b in runs)
    assert handle.nbytes < 4 * dense + 2 * (NUM_KEYS - dense)


def test_a_pruned_push_with_codec_values_across_shards(kv):
    keys = np.array([3, 140, 149, 150, 151, 299], dtype=np.int64)
    vals = np.array([0.1, -2.5, 3.0, 1e-3, 7.0, -0.3], dtype=np.float32)
    bf16 = make_codec("bf16")
    before = kv.pull().copy()
    handle = kv.push_sparse_async(keys, vals, step=0, batch=1, codec=bf16)
    kv.wait(handle)
    assert handle.nbytes == keys.nbytes + 2 * vals.size
    expected = before.copy()
    expected[keys] -= bf16.decode(bf16.encode(vals), vals.size)
    np.testing.assert_array_equal(kv.pull(), expected)
    # Keys on one shard only: the other hears an empty payload (it counts the batch).
    kv.push_sparse(np.array([5]), np.array([2.0], np.float32), step=0, batch=1,
                   codec=make_codec("uniform8"))
    expected[5] -= 2.0
    np.testing.assert_array_equal(kv.pull(), expected)


def test_a_pruned_block_codec_push_feeds_its_per_shard_rounding_back(kv):
    """uniform8 values of a top-k are re-encoded per shard (their blocks move with the
    slice): `sent` says what the shards added, and the compressor keeps the difference, so
    what reached the shards plus the residual is still the gradient."""
    import torch

    from paramserver.compression import make_compressor
    rng = np.random.default_rng(9)
    g = (rng.standard_normal(NUM_KEYS) * np.exp(rng.standard_normal(NUM_KEYS) * 3)) \
        .astype(np.float32)
    c = make_compressor("topk", fraction=0.5, codec=make_codec("uniform8", block=8))
    sparse = c.compress(torch.from_numpy(g))
    assert sparse.keys.min() < 150 <= sparse.keys.max()  # on both shards
    before = kv.pull().copy()
    sent = np.empty_like(sparse.values)
    shuffled = rng.permutation(sparse.keys.size)  # in any order: `sent` follows the caller's
    kv.wait(kv.push_sparse_async(sparse.keys[shuffled], sparse.values[shuffled], step=0,
                                 batch=1, codec=c.codec, sent=sent))
    got = np.zeros(NUM_KEYS, np.float32)
    got[sparse.keys[shuffled]] = sent
    np.testing.assert_allclose(kv.pull(), before - got, rtol=0, atol=1e-5)
    assert np.abs(sent - sparse.values[shuffled]).max() > 0  # it did round again
    c.kept(sparse.keys[shuffled], sparse.values[shuffled] - sent)
    np.testing.assert_allclose(got + c.residual.numpy(), g, rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="sent must be"):
        kv.push_sparse_async(sparse.keys, sparse.values, step=0, batch=1, sent=sent)


def test_a_codec_needs_float32_values(kv):
    with pytest.raises(ValueError, match="float32"):
        kv.push(np.ones(NUM_KEYS, dtype=np.float64), step=0, batch=1, codec=make_codec("fp16"))


def _raw_push(kv, fields: dict, frames: list, lo: int = 0, hi: int = 10) -> Message:
    f = {"range": [lo, hi], "step": 0, "version": 0, "batch": 1, **fields}
    rid = kv.requests.send(0, Message("push", f, frames))
    return kv.requests.collect([(0, rid, None)], "push")[rid]


def _good(values: np.ndarray, name: str = "bf16") -> tuple[dict, list]:
    return payload.pack(make_codec(name), values)


def _lies() -> list[tuple[str, dict, list, str]]:
    """(what, fields, frames, the error's words): every way a payload can be wrong."""
    ten = np.linspace(-1, 1, 10, dtype=np.float32)
    fields, frames = _good(ten)
    enc = fields["enc"]
    nan = np.full(10, np.nan, dtype=np.float32).view(np.uint8)
    u8_fields, u8_frames = _good(ten, "uniform8")
    return [
        ("unknown codec", {**fields, "enc": {**enc, "codec": "zip9"}}, frames, "unknown codec"),
        ("size lies", {**fields, "enc": {**enc, "size": 11}}, frames, "expected 10"),
        ("frame count lies", fields, frames + frames, "frames follow"),
        ("frame bytes lie", fields, [frames[0][:-2]], "bytes"),
        ("dtype not a frame dtype", {**fields, "enc": {**enc, "frames": [["int64", 10]]}},
         frames, "bad spec"),
        ("another codec's layout", {**fields, "enc": {**enc, "frames": [["uint8", 20]]}},
         frames, "do not fit"),
        ("bad option", {**fields, "enc_opts": {"nope": 1}}, frames, "no option"),
        ("odd option value", {**fields, "enc_opts": {"x": [1, 2]}}, frames, "options"),
        ("no header", {"enc_opts": {}, "enc": "bf16"}, frames, "enc"),
        ("NaN values", {"enc": {"codec": "fp32", "size": 10, "meta": [],
                                "frames": [["float32", 10]]}, "enc_opts": {}}, [nan],
         "NaN"),
        ("scales lie", u8_fields, [np.full(f.size, 255, np.uint8) for f in u8_frames],
         "NaN|inf|bad|scale"),
    ]


def test_a_malformed_payload_is_refused_and_the_shard_keeps_serving(kv):
    before = kv.pull().copy()
    for what, fields, frames, words in _lies():
        with pytest.raises(RemoteError, match=words):
            _raw_push(kv, fields, frames)
            pytest.fail(f"{what}: accepted")
    np.testing.assert_array_equal(kv.pull(), before)  # nothing of any of them applied
    fields, frames = _good(np.ones(10, dtype=np.float32))
    _raw_push(kv, fields, frames)
    expected = before.copy()
    expected[:10] -= 1
    np.testing.assert_array_equal(kv.pull(), expected)


# ---- compressed pulls -------------------------------------------------------------------------
def _bound(name: str, d: np.ndarray) -> np.ndarray:
    """Per value, the most `name` may lose coding `d` (bf16: half an ulp of 8 bits, relative;
    uniform8: a step of 255 over the vector's span bounds any block's half-step)."""
    if name == "bf16":
        return np.abs(d) * 2.0 ** -8
    return np.full(d.shape, (d.max() - d.min()) / 255 + 1e-7)


@pytest.mark.parametrize("name", ["bf16", "uniform8"])
def test_delta_pulls_drift_within_the_codec_bound_and_a_refresh_is_exact(kv, name):
    rng = np.random.default_rng(2)
    codec = make_codec(name)
    copy = np.empty(NUM_KEYS, dtype=np.float32)
    first = kv.pull_async(out=copy, ref=True)
    kv.wait(first)
    assert first.nbytes == NUM_KEYS * 4
    np.testing.assert_array_equal(copy, kv.pull())
    budget = np.zeros(NUM_KEYS)
    for _ in range(5):
        kv.push(rng.standard_normal(NUM_KEYS).astype(np.float32), step=0, batch=1)
        truth = kv.pull().copy()
        step_bound = _bound(name, truth - copy)
        handle = kv.pull_async(out=copy, delta=codec)
        assert kv.wait(handle) is copy
        assert handle.nbytes < NUM_KEYS * 4 / 1.9  # bf16: half the bytes, uniform8 less
        drift = np.abs(copy - truth)
        assert (drift <= step_bound).all()  # carried error: one step's bound, not a sum
        budget += step_bound
        assert (drift <= budget).all()
        assert drift.max() > 0  # lossy: the copy is not simply the dense values
    kv.pull(out=copy, ref=True)
    np.testing.assert_array_equal(copy, kv.pull())


def test_a_delta_pull_without_a_reference_comes_dense(kv):
    # Another worker (another sender): the shards know nothing it holds, so they answer dense.
    other = KVWorker(kv.join, role="observer")
    try:
        copy = np.full(NUM_KEYS, 123.0, dtype=np.float32)
        other.pull(out=copy, delta=make_codec("bf16"))
        np.testing.assert_array_equal(copy, kv.pull())
    finally:
        other.close()


def test_a_bad_delta_codec_is_refused(kv):
    for delta, words in [({"name": "zip9"}, "unknown codec"),
                         ({"name": "bf16", "opts": {"nope": 1}}, "no option")]:
        rid = kv.requests.send(0, Message("pull", {"range": [0, 10], "delta": delta}))
        with pytest.raises(RemoteError, match=words):
            kv.requests.collect([(0, rid, None)], "pull")
    np.testing.assert_array_equal(kv.pull((0, 10)).shape, (10,))


def test_a_retried_delta_pull_gets_the_reply_it_got_first():
    from paramserver.server.deltas import PullRefs
    refs = PullRefs(100, 8)
    codec = make_codec("bf16")
    head = {"version": 1, "range": [100, 108]}
    v0 = np.linspace(0, 1, 8, dtype=np.float32)
    refs.dense("w", 1, 100, 108, v0, head)
    first = refs.delta("w", 2, 100, 108, v0 + np.float32(0.3), codec, head)
    # A retry (same rid) must not move the reference again: it gets the kept reply.
    assert refs.answered("w", 2) is first
    assert refs.answered("w", 3) is None and refs.answered("x", 2) is None
    assert refs.nbytes == 8 * 5


def test_a_pruned_push_whose_payload_lies_about_its_keys_is_refused(kv):
    before = kv.pull().copy()
    fields, frames = _good(np.ones(3, dtype=np.float32))
    base = {"step": 0, "version": 0, "batch": 1, **fields}
    keys = np.array([1, 2, 3, 4], dtype=np.int64)  # four keys, three values
    for arrays, words in [([keys, *frames], "expected 4"), ([], "keys frame")]:
        rid = kv.requests.send(0, Message("push_sparse", dict(base), arrays))
        with pytest.raises(RemoteError, match=words):
            kv.requests.collect([(0, rid, None)], "push")
    np.testing.assert_array_equal(kv.pull(), before)


def test_a_delta_pull_of_a_sub_range_in_one_message(kv):
    copy = np.empty(40, dtype=np.float32)
    kv.pull((100, 140), out=copy, ref=True)
    kv.push(np.full(NUM_KEYS, 0.5, dtype=np.float32), step=0, batch=1)
    handle = kv.pull_async((100, 140), out=copy, delta=make_codec("fp16"))
    kv.wait(handle)
    assert handle.nbytes == 80
    np.testing.assert_array_equal(copy, kv.pull((100, 140)))  # 0.5 steps are exact in fp16
