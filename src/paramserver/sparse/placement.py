"""Which shard holds a key: a 64-bit mix of the key, then modulo.

Hashed ids are often close to uniform already, but structured ids (a feature id times a
stride, a field in the high bits) would pile onto a few shards under a bare modulo; the mix
spreads any pattern. Every client and server calls this same function.
"""
import numpy as np

from paramserver.sparse.mix import SALT_PLACEMENT, as_u64, mix64


def shard_of(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """The shard (int64 in [0, num_shards)) of each int64 key."""
    keys = np.asarray(keys)
    if keys.dtype != np.int64 or keys.ndim != 1:
        raise ValueError(f"keys must be a 1-D int64 array, got {keys.dtype} {keys.shape}")
    if int(num_shards) < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards!r}")
    if num_shards == 1:
        return np.zeros(len(keys), np.int64)
    h = mix64(as_u64(np.ascontiguousarray(keys)) ^ SALT_PLACEMENT)
    return (h % np.uint64(num_shards)).astype(np.int64)
