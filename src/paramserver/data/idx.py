"""IDX file format (the MNIST container): a validating numpy reader and a small writer."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

# Third magic byte -> big-endian element type, as in LeCun's format description.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dt.newbyteorder(">").str.lstrip("|"): code for code, dt in IDX_DTYPES.items()}
_GZIP_MAGIC = b"\x1f\x8b"


class IdxFormatError(ValueError):
    """An IDX file that is corrupt, truncated or not what the caller expected."""


def _read_bytes(path: Path) -> bytes:
    """Whole file contents, transparently gunzipped (by content, not by file name)."""
    raw = path.read_bytes()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise IdxFormatError(f"{path}: corrupt or truncated gzip data ({exc})") from None


def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """Decode IDX bytes into a native-endian array; every header field is checked."""
    if len(data) < 4:
        raise IdxFormatError(f"{source}: {len(data)} bytes, too short for an IDX header")
    if data[0] != 0 or data[1] != 0 or data[2] not in IDX_DTYPES:
        raise IdxFormatError(
            f"{source}: bad magic number 0x{data[:4].hex()}; expected 0x0000TTNN with type TT in "
            f"{{{', '.join(f'{c:02x}' for c in IDX_DTYPES)}}} (is this an IDX file?)")
    dtype, ndim = IDX_DTYPES[data[2]], data[3]
    if ndim == 0:
        raise IdxFormatError(f"{source}: header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IdxFormatError(f"{source}: truncated header ({len(data)} of {header} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "has trailing bytes"
        raise IdxFormatError(
            f"{source}: {what}: dimensions {dims} of {dtype.name} need {expected} bytes, "
            f"file has {len(data)}")
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: str | Path, ndim: int | None = None,
             dtype: np.dtype | str | None = None) -> np.ndarray:
    """Read an IDX file (raw or gzipped); optionally require a number of dimensions and a dtype."""
    path = Path(path)
    array = parse_idx(_read_bytes(path), source=str(path))
    if ndim is not None and array.ndim != ndim:
        raise IdxFormatError(f"{path}: expected {ndim} dimensions, found shape {array.shape}")
    if dtype is not None and array.dtype != np.dtype(dtype):
        raise IdxFormatError(f"{path}: expected element type {np.dtype(dtype).name}, "
                             f"found {array.dtype.name}")
    return array


def encode_idx(array: np.ndarray) -> bytes:
    """IDX bytes for an array of a type the format supports (used by tests and tools)."""
    array = np.asarray(array)
    key = array.dtype.newbyteorder(">").str.lstrip("|")
    if key not in _CODES:
        raise ValueError(f"IDX cannot store dtype {array.dtype}")
    if not 1 <= array.ndim <= 255:
        raise ValueError(f"IDX needs 1..255 dimensions, got {array.ndim}")
    header = bytes([0, 0, _CODES[key], array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: str | Path, array: np.ndarray, compress: bool | None = None) -> Path:
    """Write `array` as IDX; gzip when `compress` is true or, if None, when the name ends in .gz."""
    path = Path(path)
    data = encode_idx(array)
    if compress if compress is not None else path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path
