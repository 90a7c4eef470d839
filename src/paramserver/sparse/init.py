"""Deterministic per-key initial rows: the same key gives the same row on every shard, after a
restore and in a local reference, whatever batch it arrives in and in whatever order.

Each row is a pure function of (seed, key, column): a counter-based hash, splitmix64 of the
key's own hash plus the column pair's counter, gives 64 bits per two columns; each column
takes the top 24 bits of one 32-bit half as an odd integer in (-2^24, 2^24), exact in
float32, and one float32 multiply scales it into (-scale, scale). IEEE arithmetic and the
explicit half order make every platform agree.
"""
import math

import numpy as np

from paramserver.sparse.mix import GOLDEN, SALT_INIT, as_u64, mix64, mix64_int



def check_scale(scale: float) -> float:
    """`scale` as a float, or ValueError when it is not finite and >= 0."""
    s = float(scale)
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"init scale must be finite and >= 0, got {scale!r}")
    return s


def initial_rows(keys: np.ndarray, dim: int, scale: float, seed: int = 0) -> np.ndarray:
    """Rows (len(keys), dim) float32, uniform in (-scale, scale), a function of (seed, key)."""
    keys = np.asarray(keys)
    if keys.dtype != np.int64 or keys.ndim != 1:
        raise ValueError(f"keys must be a 1-D int64 array, got {keys.dtype} {keys.shape}")
    if int(dim) < 1:
        raise ValueError(f"dim must be >= 1, got {dim!r}")
    dim = int(dim)
    s = check_scale(scale)
    n = len(keys)
    if n == 0 or s == 0.0:
        return np.zeros((n, dim), np.float32)
    seed_mix = np.uint64(mix64_int((int(seed) & 0xFFFFFFFFFFFFFFFF) ^ int(SALT_INIT)))
    base = mix64(as_u64(np.ascontiguousarray(keys)) ^ seed_mix, inplace=True)
    pairs = (dim + 1) // 2
    # Built column pair major, (pairs, n): numpy's loops run long along n instead of a short
    # row at a time; the conversion below reads it back key major.
    z = (GOLDEN * np.arange(1, pairs + 1, dtype=np.uint64))[:, None] + base[None, :]
    mix64(z, inplace=True)                                          # (pairs, n)
    halves = z.T.copy().view(np.uint32).reshape(n, pairs, 2)      # (low, high) on this host
    if not np.little_endian:
        halves = np.ascontiguousarray(halves[:, :, ::-1])
    u = halves.reshape(n, 2 * pairs)[:, :dim]
    # 2 * (top 24 bits) + 1 - 2^24: odd, |f| < 2^24, so exact in int32 and in float32.
    np.right_shift(u, np.uint32(7), out=u)
    u |= np.uint32(1)
    i = u.view(np.int32)
    i -= np.int32(1 << 24)
    f = i.astype(np.float32)
    f *= np.float32(s) * np.float32(2.0**-24)
    return f
