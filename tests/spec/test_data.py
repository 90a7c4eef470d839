"""Datasets: the IDX reader, MNIST file discovery, digits, synthetic, shards and the batch sampler."""

import gzip

import numpy as np
import pytest
import torch

from paramserver.data import (DATASETS, BatchSampler, IdxFormatError, load_dataset, read_idx,
                              write_idx)
from paramserver.data.idx import encode_idx, parse_idx
from paramserver.core.registry import UnknownNameError


# --- IDX reader -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["u1", "i1", "<i2", "<i4", "<f4", "<f8"])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip_raw_and_gzipped(tmp_path, dtype, suffix):
    array = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    path = write_idx(tmp_path / f"a-idx3{suffix}", array)
    assert path.read_bytes()[:2] == (b"\x1f\x8b" if suffix else b"\x00\x00")
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == (2, 3, 4)
    np.testing.assert_array_equal(back, array)


def test_idx_header_is_big_endian():
    data = encode_idx(np.array([[1, 2, 3]], dtype=np.uint8))
    assert data == bytes([0, 0, 8, 2, 0, 0, 0, 1, 0, 0, 0, 3, 1, 2, 3])


@pytest.mark.parametrize("data, words", [
    (b"\x00\x01\x08\x01\x00\x00\x00\x01\x07", "bad magic"),
    (b"\x00\x00\x42\x01\x00\x00\x00\x01\x07", "bad magic"),
    (b"\x00\x00", "too short"),
    (b"\x00\x00\x08\x00", "0 dimensions"),
    (b"\x00\x00\x08\x03\x00\x00\x00\x01", "truncated header"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "truncated"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x01\x01\x02", "trailing bytes"),
])
def test_idx_rejects_corrupt_headers_and_sizes(data, words):
    with pytest.raises(IdxFormatError, match=words):
        parse_idx(data, source="x.idx")


def test_idx_truncated_gzip_and_wrong_shape(tmp_path):
    path = tmp_path / "t.gz"
    path.write_bytes(gzip.compress(encode_idx(np.zeros((4, 4), np.uint8)))[:-6])
    with pytest.raises(IdxFormatError, match="gzip"):
        read_idx(path)
    write_idx(tmp_path / "ok", np.zeros(3, np.uint8))
    with pytest.raises(IdxFormatError, match="expected 3 dimensions"):
        read_idx(tmp_path / "ok", ndim=3)


# --- MNIST from IDX files ---------------------------------------------------------------------
def _write_mnist(root, n_train=12, n_test=6, spelling="-idx", gz=False):
    rng = np.random.default_rng(0)
    ext = ".gz" if gz else ""
    files = {"train-images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
             "train-labels": np.arange(n_train, dtype=np.uint8) % 10,
             "t10k-images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
             "t10k-labels": np.arange(n_test, dtype=np.uint8) % 10}
    for stem, array in files.items():
        kind = "idx3" if array.ndim == 3 else "idx1"
        sep = "-" if spelling == "-idx" else "."
        write_idx(root / f"{stem}{sep}{kind}-ubyte{ext}", array)
    return files


@pytest.mark.parametrize("spelling, gz", [("-idx", False), ("-idx", True), (".idx", False)])
def test_mnist_loads_from_idx_files(tmp_path, spelling, gz):
    files = _write_mnist(tmp_path, spelling=spelling, gz=gz)
    ds = load_dataset("mnist", data_dir=tmp_path)
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    assert ds.train.X.dtype == torch.float32 and ds.train.y.dtype == torch.int64
    assert len(ds.train) == 12 and len(ds.test) == 6
    np.testing.assert_array_equal(ds.train.y.numpy(), files["train-labels"])
    # Order of pixels is kept: standardization is monotone.
    order = np.argsort(files["train-images"][0].ravel(), kind="stable")
    assert np.all(np.diff(ds.train.X[0].numpy().ravel()[order]) >= 0)


def test_mnist_missing_files_are_named(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("mnist", data_dir=tmp_path)
    msg = str(err.value)
    assert str(tmp_path) in msg and "t10k-images-idx3-ubyte" in msg
    assert "train-labels-idx1-ubyte" in msg and "t10k-labels-idx1-ubyte" in msg
    assert "train-images-idx3-ubyte[" not in msg
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_dataset("mnist", data_dir=tmp_path / "absent")


def test_mnist_corrupt_and_mismatched_files(tmp_path):
    _write_mnist(tmp_path)
    labels = tmp_path / "train-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:-3])
    with pytest.raises(IdxFormatError, match="truncated"):
        load_dataset("mnist", data_dir=tmp_path)
    write_idx(labels, np.zeros(11, np.uint8))
    with pytest.raises(IdxFormatError, match="12 images but .* 11 labels"):
        load_dataset("mnist", data_dir=tmp_path)
    write_idx(labels, np.full(12, 10, np.uint8))
    with pytest.raises(IdxFormatError, match="outside 0..9"):
        load_dataset("mnist", data_dir=tmp_path)


# --- digits and synthetic ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_digits_shapes_and_normalization(digits):
    assert digits.input_shape == (1, 8, 8) and digits.num_classes == 10
    assert len(digits.train) == 1437 and len(digits.test) == 360
    assert digits.train.X.dtype == torch.float32 and digits.test.y.dtype == torch.int64
    assert abs(float(digits.train.X.mean())) < 1e-4 and abs(float(digits.train.X.std()) - 1) < 1e-3
    # Stratified: every class has 36 (+-1) test samples.
    counts = torch.bincount(digits.test.y, minlength=10)
    assert int(counts.min()) >= 35 and int(counts.max()) <= 37


def test_digits_split_is_fixed_across_seeds(digits):
    other = load_dataset("digits", seed=123)
    assert torch.equal(other.test.X, digits.test.X) and torch.equal(other.train.y, digits.train.y)


def test_digits_file_read_without_sklearn_equals_sklearns_loader():
    from sklearn.datasets import load_digits as sk_load_digits
    from paramserver.data.digits import read_digits
    images, labels = read_digits()
    bunch = sk_load_digits()
    np.testing.assert_array_equal(images, bunch.images)
    np.testing.assert_array_equal(labels, bunch.target)


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.5])
def test_stratified_split_is_proportional_disjoint_and_covering(seed, fraction):
    from paramserver.data.base import stratified_split
    rng = np.random.default_rng(seed)
    labels = rng.choice(4, size=203, p=[0.5, 0.3, 0.15, 0.05])
    train, test = stratified_split(labels, fraction, seed=seed)
    assert len(test) == int(np.ceil(fraction * labels.size))
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(labels.size))
    for c in range(4):  # each class's share differs from its exact quota by less than one
        quota = np.sum(labels == c) * len(test) / labels.size
        assert abs(np.sum(labels[test] == c) - quota) < 1
    again = stratified_split(labels, fraction, seed=seed)
    assert np.array_equal(again[1], test)
    assert not np.array_equal(stratified_split(labels, fraction, seed=seed + 1)[1], test)


def test_synthetic_deterministic_and_configurable():
    a = load_dataset("synthetic", seed=3, samples=400, features=12, classes=3, difficulty="hard")
    b = load_dataset("synthetic", seed=3, samples=400, features=12, classes=3, difficulty="hard")
    c = load_dataset("synthetic", seed=4, samples=400, features=12, classes=3, difficulty="hard")
    assert a.input_shape == (12,) and a.num_classes == 3 and len(a.train) == 320
    assert torch.equal(a.train.X, b.train.X) and not torch.equal(a.train.X, c.train.X)
    with pytest.raises(ValueError, match="informative"):
        load_dataset("synthetic", samples=400, features=12, classes=10, informative=2)
    with pytest.raises(ValueError, match="difficulty"):
        load_dataset("synthetic", difficulty="brutal")


def test_registry_errors_list_names_and_options():
    assert set(DATASETS.names()) == {"digits", "mnist", "synthetic", "clicks"}
    with pytest.raises(UnknownNameError, match="digits"):
        load_dataset("cifar")
    with pytest.raises(ValueError, match="no option.*samples.*its options: test_fraction"):
        load_dataset("digits", samples=3)


# --- shards and batches -----------------------------------------------------------------------
@pytest.mark.parametrize("workers", [1, 3, 4, 7])
def test_shards_are_disjoint_and_cover_the_training_set(digits, workers):
    parts = [digits.shard_indices(r, workers, seed=5) for r in range(workers)]
    joined = np.concatenate(parts)
    assert len(joined) == len(digits.train) and len(np.unique(joined)) == len(joined)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    X, y = digits.shard(1 % workers, workers, seed=5)
    assert torch.equal(X, digits.train.X[parts[1 % workers]])
    assert torch.equal(y, digits.train.y[parts[1 % workers]])
    with pytest.raises(ValueError):
        digits.shard(workers, workers)


def test_sampler_changing_sizes_covers_each_epoch_once():
    X = torch.arange(10, dtype=torch.float32)[:, None]
    s = BatchSampler(X, torch.arange(10), seed=1)
    sizes = [3, 1, 4, 2, 5, 5]  # 20 samples: two epochs, batches straddle the boundary
    batches = [s.next_batch(b) for b in sizes]
    assert [len(xb) for xb, _ in batches] == sizes
    seen = torch.cat([yb for _, yb in batches])
    assert torch.equal(torch.cat([xb for xb, _ in batches])[:, 0].long(), seen)
    assert sorted(seen[:10].tolist()) == list(range(10))
    assert sorted(seen[10:].tolist()) == list(range(10))
    assert not torch.equal(seen[:10], seen[10:])  # reshuffled
    assert s.epochs_done == 2 and s.epoch == 2.0


def test_sampler_deterministic_and_oversized_batches():
    X, y = torch.zeros(7, 2), torch.arange(7)
    a, b = BatchSampler(X, y, seed=9), BatchSampler(X, y, seed=9)
    assert [a.next_indices(k).tolist() for k in (2, 5, 3)] == \
           [b.next_indices(k).tolist() for k in (2, 5, 3)]
    big = BatchSampler(X, y, seed=0).next_indices(16)
    assert len(big) == 16 and np.bincount(big, minlength=7).min() >= 2
    with pytest.raises(ValueError):
        a.next_indices(0)


def test_dataset_sampler_streams_differ_per_rank(digits):
    s0, s1 = digits.sampler(0, 2, seed=0), digits.sampler(1, 2, seed=0)
    assert len(s0) + len(s1) == len(digits.train)
    _, y0 = digits.sampler(0, 2, seed=0).next_batch(32)
    assert torch.equal(s0.next_batch(32)[1], y0)
