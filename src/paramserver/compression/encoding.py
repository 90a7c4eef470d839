"""Compact encodings of sorted unique keys for a future wire: u32, delta-varint, bitmap.

Today's wire carries int64 keys (8 bytes each). Candidates, all lossless, pure numpy:
- "u32":          4 bytes a key (dense_size <= 2**32);
- "delta-varint": gaps between consecutive keys in LEB128, 7 bits a byte; about
                  log2(1/density)/7 bytes a key, i.e. 1 byte at 10%, 1-2 bytes at 1% / 0.1%;
- "bitmap":       one bit per dense position, ceil(dense_size / 8) bytes whatever the count;
                  the smallest above 1/8 density.
`encode_keys(..., "auto")` picks the smallest, counted without encoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KEY_ENCODINGS = ("i64", "u32", "delta-varint", "bitmap")


@dataclass(frozen=True)
class EncodedKeys:
    encoding: str
    payload: np.ndarray  # int64, uint32 or uint8
    count: int

    @property
    def nbytes(self) -> int:
        return int(self.payload.nbytes)


def _gaps(keys: np.ndarray) -> np.ndarray:
    return np.diff(keys, prepend=np.int64(0)).astype(np.uint64)


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """LEB128 bytes per value: 1 + number of 7-bit groups above the lowest."""
    lengths = np.ones(values.size, dtype=np.int64)
    for shift in range(7, 64, 7):
        lengths += values >= (np.uint64(1) << np.uint64(shift))
    return lengths


def encoded_sizes(keys: np.ndarray, dense_size: int) -> dict[str, int]:
    """Bytes each encoding would take for these keys (u32 only when it can hold them)."""
    sizes = {"i64": 8 * keys.size, "delta-varint": int(_varint_lengths(_gaps(keys)).sum()),
             "bitmap": (dense_size + 7) // 8}
    if dense_size <= 2**32:
        sizes["u32"] = 4 * keys.size
    return sizes


def varint_encode(values: np.ndarray) -> np.ndarray:
    """LEB128 of unsigned values, vectorized over byte positions."""
    lengths = _varint_lengths(values)
    starts = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    for j in range(int(lengths.max(initial=0))):
        has = lengths > j
        group = (values[has] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = np.where(lengths[has] > j + 1, 0x80, 0).astype(np.uint64)
        out[starts[has] + j] = (group | more).astype(np.uint8)
    return out


def varint_decode(data: np.ndarray) -> np.ndarray:
    """Inverse of varint_encode."""
    ends = np.flatnonzero((data & 0x80) == 0)
    if (ends.size and ends[-1] != data.size - 1) or (data.size and not ends.size):
        raise ValueError("truncated varint stream")
    lengths = np.diff(ends, prepend=-1)
    starts = ends - lengths + 1
    values = np.zeros(ends.size, dtype=np.uint64)
    for j in range(int(lengths.max(initial=0))):
        has = lengths > j
        group = (data[starts[has] + j] & 0x7F).astype(np.uint64)
        values[has] |= group << np.uint64(7 * j)
    return values


def encode_keys(keys: np.ndarray, dense_size: int, encoding: str = "auto") -> EncodedKeys:
    """Encode sorted unique int64 keys in [0, dense_size)."""
    keys = np.asarray(keys, dtype=np.int64)
    if encoding == "auto":
        sizes = encoded_sizes(keys, dense_size)
        encoding = min(sizes, key=sizes.get)
    if encoding == "i64":
        payload = keys
    elif encoding == "u32":
        if dense_size > 2**32:
            raise ValueError(f"u32 keys cannot address {dense_size} positions")
        payload = keys.astype(np.uint32)
    elif encoding == "delta-varint":
        payload = varint_encode(_gaps(keys))
    elif encoding == "bitmap":
        mask = np.zeros(dense_size, dtype=bool)
        mask[keys] = True
        payload = np.packbits(mask)
    else:
        raise ValueError(f"unknown key encoding {encoding!r}; known: auto, "
                         f"{', '.join(KEY_ENCODINGS)}")
    return EncodedKeys(encoding, payload, int(keys.size))


def decode_keys(encoded: EncodedKeys, dense_size: int) -> np.ndarray:
    """The sorted int64 keys back; checks the count and the range."""
    enc, payload = encoded.encoding, encoded.payload
    if enc in ("i64", "u32"):
        keys = payload.astype(np.int64)
    elif enc == "delta-varint":
        keys = np.cumsum(varint_decode(payload)).astype(np.int64)
    elif enc == "bitmap":
        keys = np.flatnonzero(np.unpackbits(payload, count=dense_size)).astype(np.int64)
    else:
        raise ValueError(f"unknown key encoding {enc!r}; known: {', '.join(KEY_ENCODINGS)}")
    if keys.size != encoded.count or (keys.size and (keys[0] < 0 or keys[-1] >= dense_size)):
        raise ValueError(f"decoded {keys.size} keys, expected {encoded.count} in "
                         f"[0, {dense_size})")
    return keys
