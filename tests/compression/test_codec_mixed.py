"""Codec `mixed` (compression/mixed.py): runs of a vector float32, the rest through another
codec, one message per slice; what `--compress auto` pushes to keep small tensors dense."""

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paramserver.compression import Encoded, make_codec, payload
from paramserver.compression.mixed import runs_of

FEW = settings(max_examples=40, deadline=None)


@st.composite
def layouts(draw):
    """Tensor sizes laid end to end, and a dense_below that makes some of them small."""
    sizes = draw(st.lists(st.integers(0, 600), min_size=1, max_size=8))
    return sizes, draw(st.integers(0, 700))


def test_runs_are_the_small_tensors_adjacent_ones_merged():
    assert runs_of([1000, 10, 500, 5, 3, 2000], 100) == ((1000, 1010), (1510, 1518))
    assert runs_of([8192, 128, 1280, 10], 4096) == ((8192, 9610),)
    assert runs_of([8192, 0, 8192], 4096) == () and runs_of([5, 5], 0) == ()
    assert runs_of([3, 9000, 3], 4096) == ((0, 3), (9003, 9006))


@FEW
@given(layouts(), st.sampled_from(["uniform8", "bf16", "fp16"]), st.integers(0, 2**32 - 1))
def test_runs_come_back_exact_and_the_rest_within_the_inner_bound(layout, inner, seed):
    sizes, below = layout
    n = sum(sizes)
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    runs = runs_of(sizes, below)
    c = make_codec("mixed", inner=inner, dense_below=below).dense_runs(runs)
    enc = c.encode(x)
    d = make_codec("mixed", inner=inner).decode(enc, n)  # a receiver knows only the options
    mask = np.zeros(n, bool)
    for a, b in runs:
        mask[a:b] = True
    assert np.array_equal(d[mask], x[mask])
    rest = make_codec(inner)
    assert np.array_equal(d[~mask], rest.decode(rest.encode(x[~mask]), int((~mask).sum())))
    dense = int(mask.sum())
    assert enc.nbytes == 4 * dense + rest.nbytes(n - dense) == c.nbytes(n)


@FEW
@given(layouts(), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_each_slice_decodes_alone_to_the_whole_vectors_values(layout, cuts, seed):
    """A push goes in one message per shard piece or chunk: `part(lo, hi)` encodes a slice
    with the runs that fall in it, and the slices' decodes put together keep every run
    exact."""
    sizes, below = layout
    n = sum(sizes)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    runs = runs_of(sizes, below)
    c = make_codec("mixed", inner="uniform8", dense_below=below).dense_runs(runs)
    bounds = sorted({0, n, *rng.integers(0, n + 1, cuts).tolist()})
    out = np.empty(n, np.float32)
    for lo, hi in zip(bounds, bounds[1:]):
        fields, frames = payload.pack(c.part(lo, hi), x[lo:hi])
        out[lo:hi] = payload.unpack(msgpack.unpackb(msgpack.packb(fields)),
                                    [bytes(f) for f in frames], hi - lo)
    for a, b in runs:
        assert np.array_equal(out[a:b], x[a:b])


def test_without_runs_it_is_the_inner_codec():
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    enc = make_codec("mixed", inner="bf16").encode(x)
    assert enc.meta[0] == 0 and enc.frames[0].size == 0
    assert np.array_equal(make_codec("mixed", inner="bf16").decode(enc, 1000),
                          make_codec("bf16").decode(make_codec("bf16").encode(x), 1000))


@pytest.mark.parametrize("meta, words", [
    ((), "run count"), ((2, 0, 5), "run count"), ((1, 5, 5), "sorted, disjoint"),
    ((2, 0, 10, 5, 20), "sorted, disjoint"), ((1, 0, 2000), "sorted, disjoint"),
    ((1, -1, 3), "sorted, disjoint"), ((1, 0.5, 3), "sorted, disjoint"),
    ((5000,), "run count"),
])
def test_payloads_with_bad_runs_are_refused(meta, words):
    enc = Encoded("mixed", 1000, meta, (np.zeros(5, np.float32), np.zeros(995, np.int8)))
    with pytest.raises(ValueError, match=words):
        make_codec("mixed").decode(enc, 1000)


def test_frames_that_do_not_fit_the_runs_are_refused_and_nan_is_too():
    x = np.ones(600, np.float32)
    c = make_codec("mixed", inner="uniform8").dense_runs([(0, 10)])
    enc = c.encode(x)
    short = Encoded("mixed", 600, enc.meta, (enc.frames[0][:-1],) + enc.frames[1:])
    with pytest.raises(ValueError, match="do not fit"):
        c.decode(short, 600)
    x[3] = np.nan  # in a dense run
    with pytest.raises(ValueError, match="NaN or inf"):
        c.encode(x)
    with pytest.raises(ValueError, match="inner must be a codec other than mixed"):
        make_codec("mixed", inner="mixed")
