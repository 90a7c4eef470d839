"""Gradient compressors: selection vs numpy references, error feedback, DGC, key encodings."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from paramserver.compression import (COMPRESSORS, KEY_ENCODINGS, EncodedKeys, Sparse,
                                     compressor_options, decode_keys, densify, encode_keys,
                                     make_compressor, select)
from paramserver.compression.encoding import encoded_sizes, varint_decode, varint_encode
from paramserver.compression.std import population_std
from paramserver.core.registry import UnknownNameError

SCHEMES = ["none", "topk", "std", "dynamic"]


def ref_topk(x: np.ndarray, fraction: float) -> np.ndarray:
    k = min(x.size, max(1, round(fraction * x.size)))
    return np.sort(np.argsort(-np.abs(x), kind="stable")[:k])


def gradient(rng, n, kind, dtype=np.float64):
    if kind == "normal":
        return rng.standard_normal(n).astype(dtype)
    if kind == "ties":  # few distinct magnitudes: the k-th value is shared by many entries
        return rng.integers(-3, 4, n).astype(dtype)
    return np.zeros(n, dtype)


# ---- registry and options ----------------------------------------------------------------

def test_registry_names_and_unknown_name_lists_known():
    assert COMPRESSORS.names() == SCHEMES
    with pytest.raises(UnknownNameError, match="known: none, topk, std, dynamic"):
        make_compressor("top-k")


def test_unknown_option_lists_known_ones():
    with pytest.raises(ValueError, match="fractoin.*its options: error_feedback, momentum, fraction.*did you mean fraction"):
        make_compressor("topk", fractoin=0.1)
    with pytest.raises(ValueError, match="its options: error_feedback, momentum$"):
        make_compressor("none", k=2)


@pytest.mark.parametrize("name, options", [
    ("topk", {"fraction": 0}), ("topk", {"fraction": 1.5}), ("topk", {"method": "fast"}),
    ("std", {"k": 0}), ("dynamic", {"start": "max"}), ("std", {"momentum": 1.0}),
    ("topk", {"momentum": -0.1}), ("topk", {"momentum": 0.9, "error_feedback": False}),
    ("std", {"error_feedback": "yes"}), ("dynamic", {"min_fraction": 1.5}),
])
def test_bad_option_values_fail(name, options):
    with pytest.raises(ValueError):
        make_compressor(name, **options)


def test_options_have_defaults_and_help():
    opts = compressor_options("topk")
    assert opts["fraction"][0] == 0.01 and opts["error_feedback"][0] is True
    assert opts["momentum"][0] == 0.0 and all(h for _, h in opts.values())
    assert compressor_options("std")["k"][0] == 1.0
    assert compressor_options("dynamic")["start"][0] == "std"
    assert make_compressor("std", k=2).options() == {"error_feedback": True, "momentum": 0.0,
                                                     "k": 2}


@pytest.mark.parametrize("bad", [torch.zeros(2, 3), torch.zeros(4, dtype=torch.int64),
                                 torch.zeros(4, dtype=torch.float16)])
def test_bad_gradients_fail(bad):
    with pytest.raises(ValueError, match="1-D float32 or float64"):
        make_compressor("topk").compress(bad)


@pytest.mark.parametrize("name", SCHEMES)
def test_size_change_needs_reset(name):
    c = make_compressor(name)
    c.compress(torch.ones(10))
    with pytest.raises(ValueError, match="reset"):
        c.compress(torch.ones(11))
    with pytest.raises(ValueError, match="reset"):
        c.compress(torch.ones(10, dtype=torch.float64))
    c.reset()
    assert c.compress(torch.ones(11)).dense_size == 11


# ---- selection against numpy references ---------------------------------------------------

@pytest.mark.parametrize("method", ["exact", "sampled", "auto"])
@pytest.mark.parametrize("kind", ["normal", "ties", "zeros"])
@pytest.mark.parametrize("n", [1, 7, 1000, 120_000])
@pytest.mark.parametrize("fraction", [0.1, 0.01, 0.001])
def test_topk_matches_argsort_reference(method, kind, n, fraction):
    rng = np.random.default_rng(n + int(fraction * 1000))
    x = gradient(rng, n, kind, np.float32)
    c = make_compressor("topk", fraction=fraction, method=method, error_feedback=False)
    s = c.compress(torch.from_numpy(x))
    want = ref_topk(x, fraction)
    np.testing.assert_array_equal(s.keys, want)
    np.testing.assert_array_equal(s.values, x[want])
    assert s.keys.dtype == np.int64 and s.values.dtype == np.float32
    assert c.stats.sent == want.size and c.stats.threshold == np.abs(x[want]).min()


def test_sampled_topk_falls_back_when_the_sample_overshoots(monkeypatch):
    x = np.random.default_rng(1).standard_normal(100_000).astype(np.float32)
    monkeypatch.setattr(select, "sample_threshold", lambda mag, k, gen: float("inf"))
    s = make_compressor("topk", fraction=0.01, method="sampled").compress(torch.from_numpy(x))
    np.testing.assert_array_equal(s.keys, ref_topk(x, 0.01))


def test_topk_sends_exactly_k_even_when_few_are_nonzero():
    x = np.zeros(1000)
    x[[5, 900]] = [1.0, -2.0]
    s = make_compressor("topk", fraction=0.01).compress(torch.from_numpy(x))
    np.testing.assert_array_equal(s.keys, [0, 1, 2, 3, 4, 5, 6, 7, 8, 900])


@pytest.mark.parametrize("kind", ["normal", "ties", "zeros"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_std_matches_reference(kind, k):
    x = gradient(np.random.default_rng(k), 5000, kind)
    c = make_compressor("std", k=k, error_feedback=False)
    s = c.compress(torch.from_numpy(x))
    assert c.stats.threshold == pytest.approx(k * np.std(x), rel=1e-12, abs=0)
    want = np.flatnonzero(np.abs(x) > c.stats.threshold)
    np.testing.assert_array_equal(s.keys, want)
    if kind == "normal":
        assert abs(s.density - {1: 0.317, 2: 0.0455, 3: 0.0027}[k]) < 0.02
    if kind == "zeros":
        assert s.nnz == 0 and s.values.dtype == np.float64


@pytest.mark.parametrize("offset", [0.0, 1e3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_population_std_is_accurate_with_and_without_a_large_mean(offset, dtype):
    x = (np.random.default_rng(2).standard_t(3, 300_000) + offset).astype(dtype)
    rel = 1e-12 if dtype == np.float64 else 1e-5
    assert population_std(torch.from_numpy(x)) == pytest.approx(np.std(x.astype(np.float64)),
                                                                rel=rel)


def ref_dynamic(grads, start, k, min_fraction=0.0):
    """The documented rule, written out in numpy; no error feedback."""
    t, out = None, []
    for x in grads:
        a = np.abs(x)
        first = k * np.std(x) if start == "std" else a.mean()
        use = first if t is None else t
        keys = np.flatnonzero(a > use)
        if keys.size < max(1, np.ceil(min_fraction * x.size)) and t is not None:
            use = first
            keys = np.flatnonzero(a > use)
        if keys.size:
            t = a[keys].mean()
        out.append((keys, use))
    return out


@pytest.mark.parametrize("start", ["std", "mean"])
def test_dynamic_matches_reference_with_restart_and_zero_steps(start):
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(2000) * s for s in (1, 1, 1, 1, 0.01, 0.01, 0, 1, 1)]
    c = make_compressor("dynamic", start=start, k=1.0, error_feedback=False)
    restarts = []
    for x, (keys, t) in zip(grads, ref_dynamic(grads, start, 1.0)):
        s = c.compress(torch.from_numpy(x))
        np.testing.assert_array_equal(s.keys, keys)
        assert c.stats.threshold == pytest.approx(t, rel=1e-12)
        restarts.append(c.stats.restarted)
    # The scale drop at step 5 restarts; the all-zero step sends nothing and keeps t.
    assert restarts[4] and not restarts[1] and c.state["threshold"] is not None


def test_dynamic_min_fraction_restarts_before_the_threshold_starves():
    rng = np.random.default_rng(9)
    grads = [rng.standard_normal(4000) for _ in range(15)]
    c = make_compressor("dynamic", min_fraction=0.02, error_feedback=False)
    for x, (keys, _) in zip(grads, ref_dynamic(grads, "std", 1.0, min_fraction=0.02)):
        s = c.compress(torch.from_numpy(x))
        np.testing.assert_array_equal(s.keys, keys)
        assert s.density >= 0.02
    assert c.stats.total_fraction > 0.05


def test_dynamic_threshold_ratchets_up_while_the_scale_holds():
    rng = np.random.default_rng(4)
    c = make_compressor("dynamic", error_feedback=False)
    ts = []
    for _ in range(6):
        c.compress(torch.from_numpy(rng.standard_normal(20_000)))
        ts.append(c.stats.threshold)
    assert all(b > a for a, b in zip(ts, ts[1:]))


# ---- error feedback and momentum ------------------------------------------------------------

@pytest.mark.parametrize("options", [{"fraction": 0.01}, {"fraction": 0.1, "method": "sampled"}])
def test_topk_with_feedback_selects_from_residual_plus_gradient(options):
    rng = np.random.default_rng(5)
    c = make_compressor("topk", **options)
    v = np.zeros(80_000)
    for _ in range(4):
        x = rng.standard_normal(80_000)
        v += x
        s = c.compress(torch.from_numpy(x))
        want = ref_topk(v, options["fraction"])
        np.testing.assert_array_equal(s.keys, want)
        np.testing.assert_array_equal(s.values, v[want])
        v[want] = 0
        np.testing.assert_array_equal(c.residual.numpy(), v)


@pytest.mark.parametrize("name, options", [("topk", {"fraction": 0.01}), ("std", {"k": 2}),
                                           ("dynamic", {}), ("none", {})])
def test_error_feedback_loses_nothing_over_many_steps(name, options):
    rng = np.random.default_rng(6)
    c = make_compressor(name, **options)
    total_grad, total_sent = np.zeros(3000), np.zeros(3000)
    for step in range(200):
        x = rng.standard_normal(3000) * (1 + step % 7)
        total_grad += x
        total_sent += densify(c.compress(torch.from_numpy(x)))
    np.testing.assert_allclose(total_sent + c.residual.numpy(), total_grad, rtol=0, atol=1e-10)
    assert 0 < c.stats.total_fraction <= 1 and c.stats.step == 200


@pytest.mark.parametrize("name", ["topk", "std", "dynamic"])
def test_without_feedback_the_residual_stays_zero_and_values_are_the_gradient(name):
    rng = np.random.default_rng(7)
    c = make_compressor(name, error_feedback=False)
    for _ in range(5):
        x = rng.standard_normal(1000)
        s = c.compress(torch.from_numpy(x))
        np.testing.assert_array_equal(s.values, x[s.keys])
        assert not c.residual.any() and c.residual.numel() == 1000
        assert c.state["velocity"] is None


def test_dgc_momentum_correction_matches_hand_reference():
    m, frac, n = 0.9, 0.05, 400
    rng = np.random.default_rng(8)
    c = make_compressor("topk", fraction=frac, momentum=m)
    u, v = np.zeros(n), np.zeros(n)
    for _ in range(30):
        g = rng.standard_normal(n)
        u = m * u + g
        v = v + u
        keys = ref_topk(v, frac)
        sent = v[keys].copy()
        u[keys] = 0  # momentum factor masking
        v[keys] = 0
        s = c.compress(torch.from_numpy(g))
        np.testing.assert_array_equal(s.keys, keys)
        np.testing.assert_allclose(s.values, sent, rtol=1e-13)
        np.testing.assert_allclose(c.state["velocity"].numpy(), u, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(c.residual.numpy(), v, rtol=1e-13, atol=1e-13)


def test_reset_clears_residual_velocity_threshold_and_stats():
    c = make_compressor("dynamic", momentum=0.5)
    c.compress(torch.randn(100, dtype=torch.float64))
    c.reset()
    assert c.stats.step == 0 and c.stats.fraction == 0 and c.state["threshold"] is None
    assert c.state["velocity"] is None and c.residual.numel() == 0


def test_topk_sampler_is_reproducible_after_reset():
    x = torch.randn(200_000)
    c = make_compressor("topk", fraction=0.1, method="sampled", seed=3)
    first = c.compress(x)
    c.reset()
    np.testing.assert_array_equal(c.compress(x).keys, first.keys)


# ---- none, Sparse, densify ---------------------------------------------------------------------

def test_none_is_the_identity_without_copying():
    x = torch.randn(50)
    c = make_compressor("none", momentum=0.9)
    s = c.compress(x)
    assert s.is_dense and np.shares_memory(s.values, x.numpy())
    np.testing.assert_array_equal(densify(s), x.numpy())
    assert c.stats.fraction == 1.0 and not c.residual.any()
    assert s.nbytes == 50 * 12 and s.dense_nbytes == 200


def test_numpy_input_and_densify_out():
    x = np.arange(-5.0, 5.0)
    s = make_compressor("topk", fraction=0.2).compress(x)
    out = np.full(10, 7.0)
    assert densify(s, out) is out
    np.testing.assert_array_equal(out, [-5, -4, 0, 0, 0, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError):
        densify(s, np.zeros(3))
    assert Sparse(np.empty(0, np.int64), np.empty(0), 0).density == 0.0


# ---- key encodings ----------------------------------------------------------------------------

@pytest.mark.parametrize("keys, size", [([], 10), ([0], 1), ([0, 1, 2, 9], 10),
                                        ([3, 200, 70_000, 2**31 + 5], 2**32)])
def test_key_encodings_round_trip(keys, size):
    keys = np.array(keys, dtype=np.int64)
    for encoding in KEY_ENCODINGS if size < 10**6 else ("i64", "u32", "delta-varint"):
        enc = encode_keys(keys, size, encoding)
        assert enc.encoding == encoding and enc.count == keys.size
        got = decode_keys(enc, size)
        np.testing.assert_array_equal(got, keys)
        assert got.dtype == np.int64


def test_varint_handles_large_values_and_auto_picks_the_smallest():
    values = np.array([0, 127, 128, 2**35, 2**62], dtype=np.uint64)
    np.testing.assert_array_equal(varint_decode(varint_encode(values)), values)
    assert varint_encode(values).size == 1 + 1 + 2 + 6 + 9
    sparse = np.arange(0, 100_000, 100, dtype=np.int64)    # 1%: gaps of 100 = 1 byte each
    assert encode_keys(sparse, 100_000).encoding == "delta-varint"
    dense = np.arange(0, 100_000, 2, dtype=np.int64)       # 50%: the bitmap wins
    assert encode_keys(dense, 100_000).encoding == "bitmap"
    assert encoded_sizes(dense, 100_000)["bitmap"] == 12_500


def test_key_decoding_rejects_bad_input():
    with pytest.raises(ValueError, match="truncated"):
        varint_decode(np.array([0x80, 0x81], dtype=np.uint8))
    with pytest.raises(ValueError, match="expected 3"):
        decode_keys(EncodedKeys("u32", np.array([1, 2], np.uint32), 3), 10)
    with pytest.raises(ValueError, match="in \\[0, 5\\)"):
        decode_keys(EncodedKeys("i64", np.array([1, 7], np.int64), 2), 5)
    with pytest.raises(ValueError, match="known"):
        encode_keys(np.array([1]), 5, "gzip")
    with pytest.raises(ValueError, match="cannot address"):
        encode_keys(np.array([1]), 2**33, "u32")


# ---- properties ---------------------------------------------------------------------------------

small_floats = st.floats(-4, 4, width=32).map(lambda v: round(v * 2) / 2)  # many ties and zeros
any_floats = st.floats(-1e6, 1e6, allow_nan=False, width=64)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 300), elements=small_floats),
       st.sampled_from([0.5, 0.1, 0.01]), st.sampled_from(["exact", "sampled"]))
def test_property_topk_is_the_stable_argsort_top(x, fraction, method):
    s = make_compressor("topk", fraction=fraction, method=method).compress(torch.from_numpy(x))
    np.testing.assert_array_equal(s.keys, ref_topk(x, fraction))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(SCHEMES), st.booleans(), st.sampled_from([0.0, 0.5]),
       st.lists(hnp.arrays(np.float64, 64, elements=any_floats), min_size=1, max_size=6))
def test_property_each_step_splits_candidate_into_sent_and_residual(name, feedback, momentum,
                                                                    grads):
    feedback = feedback or momentum > 0
    c = make_compressor(name, error_feedback=feedback, momentum=momentum)
    for g in grads:
        before = c.residual.numpy().copy() if c.stats.step else np.zeros(64)
        velocity = c.state["velocity"]
        u = momentum * velocity.numpy() + g if velocity is not None else g
        s = c.compress(torch.from_numpy(g.copy()))
        assert np.all(np.diff(s.keys) > 0) and s.values.size == s.nnz
        cand = before + u if feedback and name != "none" else g
        kept = c.residual.numpy() if feedback else np.where(densify(s) == 0, cand, 0)
        np.testing.assert_array_equal(densify(s) + kept, cand)
        assert feedback or not c.residual.any()


@settings(max_examples=100, deadline=None)
@given(st.sets(st.integers(0, 5000)), st.sampled_from(KEY_ENCODINGS + ("auto",)))
def test_property_key_encodings_round_trip(keys, encoding):
    keys = np.array(sorted(keys), dtype=np.int64)
    enc = encode_keys(keys, 5001, encoding)
    np.testing.assert_array_equal(decode_keys(enc, 5001), keys)
    if encoding == "auto":
        assert enc.nbytes == min(encoded_sizes(keys, 5001).values())
