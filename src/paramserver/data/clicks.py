"""A synthetic click log (no download): categorical fields with Zipf-distributed ids over a
10^12 id space each, a few dense features, and a click label with a signal a model can learn.

Every (field, id) has a hidden weight computed from a hash of (data_seed, field, id), so the
infinitely many ids need no storage, and the dense features have hidden weights too:

    logit = bias + sum_f w(f, id_f) + dense . v + noise,    click ~ Bernoulli(sigmoid(logit))

Ids are drawn by rank from a power law (rank r has probability ~ r^-exponent over 1..10^12)
and each rank is mapped to an id by a hash, so the frequent ids are scattered over the space.
A frequent id's weight is learnable from the log; the long tail of ids seen once or never is
noise to any model, which is what keeps the best AUC well below 1. With the defaults a trained
DLRM reaches a held-out AUC of about 0.75 (chance: 0.5); the true logit scores about 0.84.
"""

from __future__ import annotations

import numpy as np

from paramserver.data.base import Dataset, make_dataset

ID_SPACE = 10 ** 12  # ids per field: far too many for a dense table
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 values: a bijection that scatters nearby inputs."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _hash(salt: int, field: np.ndarray | int, value: np.ndarray) -> np.ndarray:
    """A 64-bit hash of (salt, field, value), value an int64 array; field broadcasts."""
    with np.errstate(over="ignore"):
        h = mix64(np.uint64(salt & (2 ** 64 - 1)) * _GOLDEN + np.uint64(0x632BE59BD9B4E019))
        h = mix64(h ^ (np.asarray(field, dtype=np.uint64) + np.uint64(1)) * _GOLDEN)
        return mix64(h ^ np.asarray(value).astype(np.uint64))


def _unit(h: np.ndarray) -> np.ndarray:
    """uint64 hashes as floats uniform in [0, 1) (the top 53 bits)."""
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def power_law_ranks(rng: np.random.Generator, size, exponent: float, top: int) -> np.ndarray:
    """Ranks in 1..top with P(rank >= r) following the continuous power law of `exponent`
    (the Zipf law's tail), drawn by inverting its CDF: exact for any top, with no rejection
    (numpy's zipf has no upper bound and rejects draws past 2^63)."""
    u = rng.random(size)
    if abs(exponent - 1.0) < 1e-9:
        x = np.exp(u * np.log(top + 1.0))
    else:
        e = 1.0 - exponent
        x = (1.0 + u * ((top + 1.0) ** e - 1.0)) ** (1.0 / e)
    return np.clip(np.floor(x), 1, top).astype(np.int64)


def hidden_id_weights(data_seed: int, fields: np.ndarray, ids: np.ndarray,
                      scale: float) -> np.ndarray:
    """The hidden weight of each (field, id): uniform with standard deviation `scale`."""
    return (_unit(_hash(2 * data_seed + 1, fields, ids)) * 2.0 - 1.0) * (scale * np.sqrt(3.0))


def generate_clicks(n: int, rng: np.random.Generator, data_seed: int, fields: int, dense: int,
                    exponent: float, id_scale: float, noise: float, bias: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense features (n, dense) float32, ids (n, fields) int64, clicks (n,) int64)."""
    field_no = np.arange(fields, dtype=np.int64)
    ranks = power_law_ranks(rng, (n, fields), exponent, ID_SPACE)
    ids = (_hash(2 * data_seed, field_no, ranks) % np.uint64(ID_SPACE)).astype(np.int64)
    X = rng.standard_normal((n, dense)).astype(np.float32)
    v = np.random.default_rng([data_seed, 1]).standard_normal(dense) / np.sqrt(max(dense, 1))
    logit = (bias + hidden_id_weights(data_seed, field_no, ids, id_scale).sum(axis=1)
             + X.astype(np.float64) @ v + noise * rng.standard_normal(n))
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return X, ids, y


def load_clicks(data_dir=None, seed: int = 0, train: int = 200_000, test: int = 20_000,
                fields: int = 8, dense: int = 4, exponent: float = 1.1, id_scale: float = 0.6,
                noise: float = 0.5, bias: float = 0.0, data_seed: int = 0) -> Dataset:
    """`train` + `test` clicks over `fields` categorical fields and `dense` dense features.

    `exponent` is the power law's (larger: fewer distinct ids, more learnable), `id_scale` the
    standard deviation of the hidden id weights, `noise` that of the logit's Gaussian noise,
    `bias` the logit's offset (negative: fewer clicks). `seed` is ignored on purpose, as for
    digits: runs with different training seeds share one click log, fixed by `data_seed`.
    """
    train, test, fields, dense = int(train), int(test), int(fields), int(dense)
    exponent, data_seed = float(exponent), int(data_seed)
    if train < 1 or test < 1 or fields < 1 or dense < 0:
        raise ValueError(f"clicks needs train >= 1, test >= 1, fields >= 1 and dense >= 0; "
                         f"got {train=}, {test=}, {fields=}, {dense=}")
    if not exponent > 0.0 or float(id_scale) < 0 or float(noise) < 0 or data_seed < 0:
        raise ValueError(f"clicks needs exponent > 0, id_scale >= 0, noise >= 0 and "
                         f"data_seed >= 0; got {exponent=}, {id_scale=}, {noise=}, {data_seed=}")
    # One stream per split, so the test set is the same whatever the training set's size.
    parts = [generate_clicks(n, np.random.default_rng([data_seed, 2, which]), data_seed, fields,
                             dense, exponent, float(id_scale), float(noise), float(bias))
             for which, n in enumerate((train, test))]
    (X_tr, ids_tr, y_tr), (X_te, ids_te, y_te) = parts
    return make_dataset("clicks", X_tr, y_tr, X_te, y_te, num_classes=2,
                        ids_train=ids_tr, ids_test=ids_te)
