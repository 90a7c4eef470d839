"""Model <-> flat key space: layout, exact round trips, reused gradient buffers, neuron rows."""

import numpy as np
import pytest
import torch

from paramserver.core.keyspace import KeyRange
from paramserver.models import ModelKeys, build_model


@pytest.fixture
def mlp():
    return build_model("mlp", (1, 8, 8), 10, seed=0, hidden=16)


def test_layout_tiles_the_key_space(mlp):
    keys = ModelKeys(mlp)
    sizes = [p.numel() for p in mlp.parameters()]
    assert keys.num_keys == sum(sizes)
    for ranges in ([s.keys for s in keys.params], [l.keys for l in keys.layers]):
        assert ranges[0].lo == 0 and ranges[-1].hi == keys.num_keys
        assert all(a.hi == b.lo for a, b in zip(ranges, ranges[1:]))
    assert [s.keys.size for s in keys.params] == sizes
    assert [l.params for l in keys.layers] == [(f"{i}.weight", f"{i}.bias") for i in (1, 3, 5, 7)]
    assert keys.layers[0].keys == KeyRange(0, 64 * 16 + 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, np.float64])
def test_flatten_load_round_trip_is_exact(mlp, dtype):
    keys = ModelKeys(mlp, dtype=dtype)
    flat = keys.flatten_params(mlp)
    assert flat.shape == (keys.num_keys,) and flat.dtype == keys.dtype
    expect = torch.cat([p.detach().reshape(-1) for p in mlp.parameters()]).to(keys.dtype)
    assert torch.equal(flat, expect)
    other = build_model("mlp", (1, 8, 8), 10, seed=1, hidden=16)
    keys.load_flat(other, flat)
    assert all(torch.equal(a, b) for a, b in zip(mlp.parameters(), other.parameters()))


def test_numpy_buffers_are_written_in_place_and_read_only_sources_load(mlp):
    keys = ModelKeys(mlp, dtype=np.float64)
    buf = np.zeros(keys.num_keys, dtype=np.float64)
    assert keys.flatten_params(mlp, out=buf) is buf and buf.any()
    frame = np.frombuffer((buf * 2).astype(np.float32).tobytes(), dtype=np.float32)
    keys.load_flat(mlp, frame)  # read-only, different dtype
    np.testing.assert_array_equal(keys.flatten_params(mlp), buf * 2)


def test_grads_go_into_a_reused_buffer(mlp):
    keys = ModelKeys(mlp)
    buf = keys.new_buffer()
    ptr = buf.data_ptr()
    for seed in range(2):
        mlp.zero_grad()
        torch.manual_seed(seed)
        mlp(torch.randn(4, 1, 8, 8)).pow(2).sum().backward()
        assert keys.flatten_grads(mlp, out=buf) is buf and buf.data_ptr() == ptr
        expect = torch.cat([p.grad.reshape(-1) for p in mlp.parameters()])
        assert torch.equal(buf, expect)
    mlp.zero_grad(set_to_none=True)
    next(mlp.parameters()).grad = torch.ones(16, 64)
    keys.flatten_grads(mlp, out=buf)  # missing grads read as zeros
    assert buf[:1024].eq(1).all() and not buf[1024:].any()


def test_row_range_is_one_neuron(mlp):
    keys = ModelKeys(mlp)
    flat = keys.flatten_params(mlp)
    weight = mlp[3].weight  # (16, 16)
    r = keys.row_range("3.weight", 5)
    assert r.size == 16 and torch.equal(flat[r.lo:r.hi], weight[5].detach())
    b = keys.row_range("3.bias", 5)
    assert b.size == 1 and flat[b.lo] == mlp[3].bias[5]
    assert keys.locate(r.lo) == ("3.weight", 5) and keys.locate(r.hi - 1) == ("3.weight", 5)
    assert torch.equal(keys.view(flat, "3.weight"), weight.detach())
    with pytest.raises(IndexError):
        keys.row_range("3.weight", 16)
    with pytest.raises(KeyError, match="known: 1.weight"):
        keys.row_range("nope", 0)


def test_cnn_rows_are_filters_and_mismatches_fail():
    cnn = build_model("cnn", (1, 8, 8), 10)
    keys = ModelKeys(cnn)
    flat = keys.flatten_params(cnn)
    r = keys.row_range("0.weight", 3)
    assert torch.equal(flat[r.lo:r.hi].view(1, 3, 3), cnn[0].weight[3].detach())
    with pytest.raises(ValueError, match="shape"):
        keys.load_flat(cnn, flat[:-1])
    with pytest.raises(ValueError, match="parameter tensors"):
        keys.flatten_params(build_model("logreg", (1, 8, 8), 10))
