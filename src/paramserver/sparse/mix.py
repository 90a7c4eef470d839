"""The 64-bit mixer the sparse package hashes with (splitmix64's finalizer), vectorized.

Each use salts the key differently, so the shard a key lands on, its slot in a shard's key
index and its initial row are unrelated: a shard's keys must not all share hash bits, or its
index would use only a fraction of its slots.
"""
import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_ALL = (1 << 64) - 1

# Salts, one per use (arbitrary odd constants).
SALT_PLACEMENT = np.uint64(0x243F6A8885A308D3)
SALT_INDEX = np.uint64(0x13198A2E03707344)
SALT_INIT = np.uint64(0xA4093822299F31D0)


def mix64(x: np.ndarray, *, inplace: bool = False) -> np.ndarray:
    """splitmix64 of each element of a uint64 array (wrapping arithmetic): a new array, or x
    itself, overwritten, with inplace."""
    z = x if inplace else x + GOLDEN
    if inplace:
        z += GOLDEN
    t = np.right_shift(z, _S30)
    z ^= t
    z *= _M1
    z ^= np.right_shift(z, _S27, out=t)
    z *= _M2
    z ^= np.right_shift(z, _S31, out=t)
    return z


def mix64_int(x: int) -> int:
    """mix64 of one 64-bit value, in Python integers."""
    z = (x + int(GOLDEN)) & _ALL
    z = ((z ^ (z >> 30)) * int(_M1)) & _ALL
    z = ((z ^ (z >> 27)) * int(_M2)) & _ALL
    return z ^ (z >> 31)


def as_u64(keys: np.ndarray) -> np.ndarray:
    """int64 keys seen as their uint64 bit patterns (no copy)."""
    return keys.view(np.uint64)
