"""Value codecs (issue 22): each codec's stated bound, payload sizes, the wire form, bad input,
and error feedback through a compressor carrying a codec (sent + residual == sum of grads)."""

import math

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from paramserver.compression import (CODECS, Encoded, codec_options, densify, make_codec,
                                     make_compressor)
from paramserver.compression.casts import BF16_MAX, FP16_MAX
from paramserver.compression.quant8 import BucketFinder
from paramserver.compression.randomk import random_positions, runs
from paramserver.core.registry import UnknownNameError

NAMES = ["fp32", "fp16", "fp16-scaled", "bf16", "uniform8", "quantile8", "sign", "randomk",
         "powersgd"]
FEW = settings(max_examples=30, deadline=None)

# Any finite float32 (zeros, subnormals, up to 3.4e38) ...
any_float = st.floats(width=32, allow_nan=False, allow_infinity=False)
# ... and vectors whose magnitudes sit around one scale picked from tiny to huge.
vectors = hnp.arrays(np.float32, st.integers(0, 700), elements=any_float)


@st.composite
def scaled_vectors(draw, max_size=700):
    n = draw(st.integers(1, max_size))
    seed = draw(st.integers(0, 2**32 - 1))
    exp = draw(st.sampled_from([-140, -120, -60, -20, 0, 20, 60, 100, 120]))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * np.float32(2.0 ** exp)
    if draw(st.booleans()):
        x[rng.random(n) < 0.3] = 0  # zeros among them
    return x


inputs = st.one_of(vectors, scaled_vectors())


def roundtrip(name, x, **options):
    c = make_codec(name, **options)
    enc = c.encode(x)
    d = c.decode(enc, x.size)
    assert d.dtype == np.float32 and d.shape == x.shape
    return enc, d


def err(d, x):
    return np.abs(d.astype(np.float64) - x.astype(np.float64))


# ---- registry --------------------------------------------------------------------------------

def test_registry_names_options_and_unknown_ones():
    assert CODECS.names() == NAMES + ["mixed"]  # (tests/compression/test_codec_mixed.py)
    with pytest.raises(UnknownNameError, match="known: fp32, fp16, fp16-scaled, bf16"):
        make_codec("fp8")
    with pytest.raises(ValueError, match="no option.*blok.*its options: block.*did you mean block"):
        make_codec("uniform8", blok=8)
    assert codec_options("powersgd")["rank"][0] == 4
    assert make_codec("randomk", fraction=0.5).options() == {"fraction": 0.5, "seed": 0,
                                                              "unbiased": False}


@pytest.mark.parametrize("name, options", [
    ("uniform8", {"block": 0}), ("sign", {"block": 2.5}), ("quantile8", {"sample": 10}),
    ("randomk", {"fraction": 0}), ("randomk", {"fraction": 1.5}), ("randomk", {"seed": -1}),
    ("randomk", {"unbiased": "yes"}), ("powersgd", {"rank": 0}), ("powersgd", {"cols": -1}),
])
def test_bad_option_values_fail(name, options):
    with pytest.raises(ValueError):
        make_codec(name, **options)


@pytest.mark.parametrize("bad", [np.zeros((2, 3), np.float32), np.zeros(4, np.float64),
                                 torch.zeros(4, dtype=torch.float16)])
def test_only_flat_float32_is_taken(bad):
    with pytest.raises(ValueError, match="1-D float32"):
        make_codec("fp16").encode(bad)


# ---- bounds, codec by codec ------------------------------------------------------------------

@FEW
@given(inputs)
def test_fp32_is_exact(x):
    _, d = roundtrip("fp32", x)
    assert np.array_equal(d, x)


@FEW
@given(inputs)
def test_fp16_relative_bound_in_range_and_saturates_beyond(x):
    enc, d = roundtrip("fp16", x)
    inside = np.abs(x) <= FP16_MAX
    bound = np.maximum(2.0**-11 * np.abs(x.astype(np.float64)), 2.0**-25)
    assert (err(d, x)[inside] <= bound[inside]).all()
    assert np.array_equal(d[~inside], np.sign(x[~inside]) * np.float32(FP16_MAX))
    assert np.isfinite(d).all()


@FEW
@given(inputs)
def test_fp16_scaled_keeps_relative_precision_at_any_scale(x):
    enc, d = roundtrip("fp16-scaled", x)
    amax = float(np.abs(x).max()) if x.size else 0.0
    bound = np.maximum(2.0**-11 * np.abs(x.astype(np.float64)), 2.0**-39 * amax) + 2.0**-149
    assert (err(d, x) <= bound).all()
    if amax:  # the scaled maximum sits in [2^14, 2^15), fp16's top octave but one
        assert 2**14 <= amax * 2.0 ** enc.meta[0] < 2**15 or abs(enc.meta[0]) == 126


def test_fp16_scaled_beats_fp16_on_small_gradients():
    x = (np.random.default_rng(0).standard_normal(1000) * 1e-6).astype(np.float32)
    rel = lambda name: np.abs(roundtrip(name, x)[1] - x).max() / np.abs(x).max()
    assert rel("fp16-scaled") < 2.0**-11 < rel("fp16")


@FEW
@given(inputs)
def test_bf16_relative_bound(x):
    _, d = roundtrip("bf16", x)
    inside = np.abs(x) <= BF16_MAX
    bound = np.maximum(2.0**-8 * np.abs(x.astype(np.float64)), 2.0**-133)
    assert (err(d, x)[inside] <= bound[inside]).all()
    assert np.array_equal(d[~inside], np.sign(x[~inside]) * np.float32(BF16_MAX))


@FEW
@given(inputs, st.sampled_from([1, 7, 64, 256]))
def test_uniform8_error_at_most_half_a_step_per_block(x, block):
    enc, d = roundtrip("uniform8", x, block=block)
    q, scale = enc.frames
    assert q.dtype == np.int8 and np.abs(q.astype(int)).max(initial=0) <= 127
    pad = np.zeros(scale.size * block, np.float64)
    pad[:x.size] = np.abs(x)
    amax = pad.reshape(-1, block).max(axis=1)
    assert np.allclose(scale.astype(np.float64) * 127, amax, rtol=2.0**-22, atol=2.0**-140)
    step = np.repeat(scale.astype(np.float64), block)[:x.size]
    assert (err(d, x) <= step * (0.5 + 2.0**-16) + 2.0**-142).all()


@FEW
@given(inputs)
def test_quantile8_codes_are_monotone_and_levels_are_their_values_means(x):
    enc, d = roundtrip("quantile8", x)
    codes, table = enc.frames
    assert table.size == min(256, x.size)
    order = np.argsort(x, kind="stable")
    assert (np.diff(codes[order].astype(int)) >= 0).all()  # larger x, never a smaller code
    for c in np.unique(codes):
        group = x[codes == c].astype(np.float64)
        lo, hi = group.min(), group.max()
        slack = 2.0**-23 * max(abs(lo), abs(hi))
        assert lo - slack <= table[c] <= hi + slack  # hence |d - x| <= hi - lo (+ slack)
    assert np.isfinite(d).all()


@FEW
@given(inputs, hnp.arrays(np.float32, st.integers(0, 255), elements=any_float))
def test_quantile8_bucket_finder_equals_torch_bucketize(x, borders):
    borders = torch.from_numpy(np.sort(borders))
    for data in (x, borders.numpy()):  # values on the borders themselves too
        t = torch.from_numpy(data)
        assert torch.equal(BucketFinder(borders)(t), torch.bucketize(t, borders, out_int32=True))


def test_quantile8_keeps_each_codes_sum():
    x = np.random.default_rng(1).standard_t(3, 100_000).astype(np.float32)
    enc, d = roundtrip("quantile8", x)
    codes = enc.frames[0]
    for c in range(0, 256, 17):
        sel = codes == c
        assert math.isclose(d[sel].sum(dtype=np.float64), x[sel].sum(dtype=np.float64),
                            rel_tol=1e-5, abs_tol=1e-5)


@FEW
@given(inputs, st.sampled_from([1, 8, 100, 256]))
def test_sign_keeps_signs_and_each_blocks_l1(x, block):
    enc, d = roundtrip("sign", x, block=block)
    bits, scale = enc.frames
    assert bits.size == -(-x.size // 8)
    m = np.repeat(scale.astype(np.float64), block)[:x.size]
    assert np.array_equal(np.sign(d[x != 0]), np.sign(x[x != 0]))
    zero = x == 0  # the sign bit is sent: 0.0 -> +m, -0.0 -> -m
    signs = np.where(np.signbit(x[zero]), -1, 1)
    assert np.array_equal(d[zero], signs * m[zero].astype(np.float32))
    assert np.allclose(np.abs(d), m.astype(np.float32))
    pad = np.zeros(scale.size * block)
    pad[:x.size] = np.abs(x.astype(np.float64))
    l1 = pad.reshape(-1, block).sum(axis=1)
    counts = np.minimum(block, x.size - np.arange(scale.size) * block)
    assert np.allclose(scale * counts, l1, rtol=1e-5)
    amax = np.repeat(pad.reshape(-1, block).max(axis=1), block)[:x.size]
    assert (err(d, x) <= np.maximum(m, amax - m) * (1 + 1e-5)).all()


@FEW
@given(inputs, st.floats(0.001, 1.0), st.integers(0, 2**31))
def test_randomk_receiver_finds_the_positions_from_the_seed_alone(x, fraction, seed):
    sender = make_codec("randomk", fraction=fraction, seed=seed)
    sender.encode(x)  # the step moves on: the second payload is for step 1
    enc = sender.encode(x)
    assert enc.meta == (seed, 1)
    n, k = x.size, enc.frames[0].size
    assert k == (min(n, max(1, round(fraction * n))) if n else 0)
    receiver = make_codec("randomk", fraction=fraction)  # its own seed option is not needed
    d = receiver.decode(enc, n)
    pos = random_positions(seed, 1, n, k)
    assert np.array_equal(pos, np.sort(np.unique(pos)))  # sorted and distinct
    cuts = runs(n, k)
    assert ((pos >= cuts[:-1]) & (pos < cuts[1:])).all()  # one in each run
    assert np.array_equal(d[pos], x[pos]) and np.array_equal(enc.frames[0], x[pos])
    rest = np.ones(n, bool)
    rest[pos] = False
    assert not d[rest].any()


def test_randomk_positions_move_with_the_step_and_the_seed():
    a = random_positions(1, 0, 10_000, 100)
    assert np.array_equal(a, random_positions(1, 0, 10_000, 100))  # a pure function
    assert len({tuple(random_positions(s, t, 10_000, 100)) for s in (1, 2) for t in (0, 1)}) == 4


def test_randomk_unbiased_decode_averages_to_the_input():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(103).astype(np.float32)  # 103 = 10 runs of 10 or 11
    c = make_codec("randomk", fraction=0.1, unbiased=True, seed=5)
    draws = 2000
    total = np.zeros(x.size)
    for _ in range(draws):
        total += c.decode(c.encode(x), x.size)
    mean = total / draws
    # Each position is sent with p = 1/10 or 1/11 and scaled by 10 or 11: std of the mean
    # is |x| * sqrt((len - 1) / draws), under |x| * sqrt(10 / draws); 5 sigma.
    assert (np.abs(mean - x) <= 5 * np.abs(x) * math.sqrt(10 / draws) + 1e-6).all()
    plain = make_codec("randomk", fraction=0.1, seed=5)
    assert np.abs(plain.decode(plain.encode(x), x.size)).sum() < np.abs(x).sum() / 5


def matrix_vector(rows, cols, rank, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((rows, rank)) @ rng.standard_normal((rank, cols))
    return m.astype(np.float32).reshape(-1)


@pytest.mark.parametrize("rows, cols, rank", [(30, 30, 1), (40, 25, 3), (64, 64, 4)])
def test_powersgd_rank_r_matrix_comes_back_exactly(rows, cols, rank):
    x = matrix_vector(rows, cols, rank)
    c = make_codec("powersgd", rank=rank, cols=cols)
    for _ in range(2):  # the first step, then a warm-started one
        enc = c.encode(x)
        d = c.decode(enc, x.size)
        assert np.linalg.norm(d - x) <= 1e-5 * np.linalg.norm(x)
    assert enc.meta[:3] == (rows, cols, rank)


def test_powersgd_repeated_steps_approach_the_best_rank_r_approximation():
    x = np.random.default_rng(2).standard_normal(48 * 48).astype(np.float32)
    m = x.reshape(48, 48).astype(np.float64)
    s = np.linalg.svd(m, compute_uv=False)
    best = math.sqrt((s[2:] ** 2).sum())  # rank 2
    c = make_codec("powersgd", rank=2)
    errors = [np.linalg.norm(c.decode(c.encode(x), x.size) - x) for _ in range(40)]
    assert errors[-1] <= best * 1.01 < errors[0]


@FEW
@given(inputs, st.integers(1, 5), st.integers(0, 40))
def test_powersgd_is_a_projection(x, rank, cols):
    c = make_codec("powersgd", rank=rank, cols=cols)
    for _ in range(2):
        enc = c.encode(x)
        d = c.decode(enc, x.size)
        rows, ncols, r, e = enc.meta
        if not x.size:
            assert d.size == 0
            continue
        assert rows * ncols >= x.size > (rows - 1) * ncols and r == min(rank, rows, ncols)
        p = enc.frames[0].reshape(rows, r).astype(np.float64)
        q = enc.frames[1].reshape(ncols, r).astype(np.float64)
        assert np.allclose(p.T @ p, np.eye(r), atol=1e-5)  # orthonormal columns
        # The matrix is x row-major, zero padded; the payload's P Q^T 2^-e is its orthogonal
        # projection onto span(P): ||M - D||^2 + ||D||^2 == ||M||^2. In units of max|x|.
        amax = float(np.abs(x).max()) or 1.0
        m = np.zeros(rows * ncols)
        m[:x.size] = x / amax
        full = (p @ q.T).reshape(-1) * (2.0 ** -e / amax)
        total = (m ** 2).sum()
        assert abs(((m - full) ** 2).sum() + (full ** 2).sum() - total) <= 1e-4 * total
        # decode is that D, rounded to float32 (down to float32's subnormal step), saturated
        # at float32's top (a projection may exceed the largest input).
        top = float(np.finfo(np.float32).max) / amax
        assert np.allclose(d / amax, np.clip(full[:x.size], -top, top), rtol=1e-5,
                           atol=2.0**-148 / amax + 1e-6)


def test_powersgd_near_square_shape_for_a_flat_vector():
    c = make_codec("powersgd", rank=4)
    assert c.shape(1_000_000) == (1000, 1000, 4)
    assert c.shape(1001) == (32, 32, 4)  # ceil(sqrt) columns; 23 zeros pad the last row
    assert make_codec("powersgd", rank=4, cols=100).shape(1001) == (11, 100, 4)
    assert c.shape(1) == (1, 1, 1) and c.shape(0) == (0, 0, 0)


# ---- bytes ---------------------------------------------------------------------------------

def expected_nbytes(name, n):
    blocks = -(-n // 256)
    if name in ("fp16", "fp16-scaled", "bf16"):
        return 2 * n
    if name == "uniform8":
        return n + 4 * blocks
    if name == "quantile8":
        return n + 4 * min(256, n)
    if name == "sign":
        return -(-n // 8) + 4 * blocks
    if name == "randomk":
        return 4 * max(1, round(0.01 * n))
    if name == "powersgd":
        cols = math.isqrt(n - 1) + 1
        rows = -(-n // cols)
        return 4 * min(4, rows) * (rows + cols)
    return 4 * n


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 255, 256, 1000, 1 << 16])
def test_bytes_per_value_follow_the_formula(name, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    c = make_codec(name)
    enc = c.encode(x)
    assert enc.nbytes == expected_nbytes(name, n) == c.nbytes(n)
    header, frames = enc.to_wire()
    assert len(msgpack.packb(header, use_bin_type=True)) < 100
    assert sum(len(f) for f in frames) == enc.nbytes


def test_bytes_per_value_at_64k():
    n = 1 << 16
    x = np.ones(n, np.float32)
    per = {name: make_codec(name).encode(x).bytes_per_value for name in NAMES}
    assert per["fp32"] == 4 and per["fp16"] == per["bf16"] == per["fp16-scaled"] == 2
    assert per["uniform8"] == 1 + 4 / 256 and per["quantile8"] == 1 + 1024 / n
    assert per["sign"] == 1 / 8 + 4 / 256 and per["randomk"] == 4 * 655 / n
    assert per["powersgd"] == 4 * 4 * 512 / n


# ---- the wire form and bad input --------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_wire_roundtrip_through_msgpack_and_bytes(name):
    x = np.random.default_rng(7).standard_normal(1234).astype(np.float32)
    sender, receiver = make_codec(name), make_codec(name)
    enc = sender.encode(x)
    header, frames = enc.to_wire()
    back = Encoded.from_wire(msgpack.unpackb(msgpack.packb(header, use_bin_type=True)),
                             [bytes(f) for f in frames])  # read-only buffers, as off a socket
    assert np.array_equal(receiver.decode(back, x.size), sender.decode(enc, x.size))


@pytest.mark.parametrize("name", NAMES)
def test_empty_and_strided_vectors(name):
    for x in (np.zeros(0, np.float32), torch.arange(40.0)[::2]):
        c = make_codec(name)
        header, frames = c.encode(x).to_wire()
        back = Encoded.from_wire(msgpack.unpackb(msgpack.packb(header)), [bytes(f) for f in frames])
        d = c.decode(back, len(x))
        assert d.shape == (len(x),) and (name not in ("fp32", "fp16") or np.array_equal(d, x))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [[1.0, float("nan"), 2.0], [float("inf")], [0.0, -float("inf")]])
def test_non_finite_input_is_refused(name, bad):
    with pytest.raises(ValueError, match="NaN or inf"):
        make_codec(name).encode(np.array(bad * 50, np.float32))


@pytest.mark.parametrize("name", NAMES)
def test_payloads_that_do_not_fit_are_refused(name):
    x = np.random.default_rng(8).standard_normal(600).astype(np.float32)
    c = make_codec(name)
    enc = c.encode(x)
    with pytest.raises(ValueError, match="expected 599"):
        c.decode(enc, 599)
    short = Encoded(enc.codec, enc.size, enc.meta, (enc.frames[0][:-1],) + enc.frames[1:])
    with pytest.raises(ValueError, match="do not fit"):
        c.decode(short, 600)
    other = "fp32" if name != "fp32" else "fp16"
    with pytest.raises(ValueError, match="expected 600"):
        make_codec(other).decode(enc, 600)


@pytest.mark.parametrize("header, frames, match", [
    ("x", [], "needs codec"),
    ({"codec": "fp16", "size": 2, "meta": [], "frames": [["float16", 2]]}, [], "announces"),
    ({"codec": "fp16", "size": -1, "meta": [], "frames": []}, [], "bad codec"),
    ({"codec": "fp16", "size": 2, "meta": ["a"], "frames": []}, [], "meta"),
    ({"codec": "fp16", "size": 2, "meta": [], "frames": [["float64", 2]]}, [b"x" * 16],
     "bad spec"),
    ({"codec": "fp16", "size": 2, "meta": [], "frames": [["float16", 2]]}, [b"xyz"], "bytes"),
])
def test_bad_wire_headers_are_refused(header, frames, match):
    with pytest.raises(ValueError, match=match):
        Encoded.from_wire(header, frames)


def test_bad_meta_and_codes_are_refused():
    x = np.arange(100, dtype=np.float32)
    p = make_codec("powersgd")
    enc = p.encode(x)
    with pytest.raises(ValueError, match=r"is not \[rows, cols, rank, exponent\]"):
        p.decode(Encoded("powersgd", 100, (5, 20, 4, 0), enc.frames), 100)
    q = make_codec("quantile8")
    enc = q.encode(x)
    codes = enc.frames[0].copy()
    codes[0] = 200  # 100 values: 100 levels
    with pytest.raises(ValueError, match="beyond"):
        q.decode(Encoded("quantile8", 100, (), (codes, enc.frames[1])), 100)
    with pytest.raises(ValueError, match="seed, step"):
        make_codec("randomk").decode(Encoded("randomk", 100, (1,), (np.zeros(1, np.float32),)),
                                     100)


def test_reset_forgets_the_encoders_state():
    x = np.random.default_rng(9).standard_normal(500).astype(np.float32)
    for name in ("powersgd", "randomk"):
        c = make_codec(name)
        first = c.encode(x)
        c.encode(x)
        c.reset()
        again = c.encode(x)
        assert again.meta == first.meta
        assert all(np.array_equal(a, b) for a, b in zip(again.frames, first.frames))


# ---- with a compressor: error feedback -----------------------------------------------------

def grads(seed, n, steps, scale):
    rng = np.random.default_rng(seed)
    return [(rng.standard_t(3, n) * scale).astype(np.float32) for _ in range(steps)]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(NAMES), st.sampled_from(["none", "topk", "std", "dynamic"]),
       st.integers(1, 400), st.integers(0, 2**32 - 1),
       st.sampled_from([1e-30, 1e-3, 1.0, 1e6]))
def test_sent_plus_residual_is_the_sum_of_gradients(codec, pruner, n, seed, scale):
    options = {"fraction": 0.1} if pruner == "topk" else {}
    c = make_compressor(pruner, codec=make_codec(codec), **options)
    total = np.zeros(n)
    sent = np.zeros(n)
    for g in grads(seed, n, 4, scale):
        s = c.compress(g)
        assert s.encoded is not None and s.encoded.size == s.nnz
        # A receiver decodes with a codec of its own (same options, none of the state).
        assert np.array_equal(s.values, make_codec(codec).decode(s.encoded, s.nnz))
        total += g
        sent += densify(s)
    residual = c.residual.numpy().astype(np.float64)
    tol = 1e-5 * np.abs(total).max() + 1e-6 * scale * 4
    assert np.abs(sent + residual - total).max() <= tol


def test_codec_error_feeds_back_so_the_sent_sum_tracks_the_true_one():
    # Sign with feedback: over many steps the sent sum stays within one residual of the truth,
    # while without feedback it drifts.
    gs = grads(4, 2000, 60, 1.0)
    truth = np.sum(gs, axis=0)
    drift = {}
    for ef in (True, False):
        c = make_compressor("none", codec=make_codec("sign"), error_feedback=ef)
        sent = sum(densify(c.compress(g)).astype(np.float64) for g in gs)
        drift[ef] = np.linalg.norm(sent - truth)
    assert drift[True] < drift[False] / 3


def test_topk_with_bf16_values_sends_the_same_keys_and_rounds_only_the_values():
    g = np.random.default_rng(5).standard_normal(10_000).astype(np.float32)
    plain = make_compressor("topk", fraction=0.01).compress(g)
    coded = make_compressor("topk", fraction=0.01, codec=make_codec("bf16")).compress(g)
    assert np.array_equal(plain.keys, coded.keys)
    assert (np.abs(coded.values - plain.values) <= 2.0**-8 * np.abs(plain.values)).all()
    assert coded.value_nbytes == 2 * coded.nnz and plain.value_nbytes == 4 * plain.nnz
    assert coded.encoded.codec == "bf16"


def test_compressor_codec_checks():
    with pytest.raises(ValueError, match="must be a Codec"):
        make_compressor("topk", codec="bf16")
    c = make_compressor("topk", codec=make_codec("fp16"))
    with pytest.raises(ValueError, match="float32"):
        c.compress(np.zeros(10, np.float64))
    bad = np.ones(10, np.float32)
    bad[3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        make_compressor("none", codec=make_codec("fp16")).compress(bad)
