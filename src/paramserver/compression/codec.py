"""Value codecs: a float32 vector <-> a payload of fewer bytes (`Encoded`), issue 22.

A codec is the precision axis beside the pruners: `encode(x)` takes a 1-D float32 vector
(torch or numpy) and returns an `Encoded`; `decode(enc, size)` gives back float32 of that
size. decode needs nothing but the payload and the codec's options, so a receiver builds its
own codec with the sender's options and keeps no state; stateful encoders (PowerSGD's warm
start, random-k's step counter) hold their state in the object, and reset() forgets it.

Non-finite input (NaN, +-inf) is refused with a ValueError by every codec: a NaN pushed to a
server would spread through its float32 master values silently.

Values on a device (a cuda model's gradient) are encoded there: `encode_decoded(x)` gives the
payload, its frames copied to the host (the copy is as small as the payload), and what it
decodes to on x's own device, for error feedback. Codecs whose arithmetic is all torch ops
(`device_native`: the casts and uniform8) run it on the device; the others copy the vector to
the host first and encode it there, and send what it decodes to back: right, not faster.

On the wire an `Encoded` is small header fields plus raw little-endian frames (`to_wire`):
    {"codec": name, "size": n, "meta": [ints/floats], "frames": [[dtype, count], ...]}
followed by one frame per array, msgpack for the header, no pickle. `nbytes` counts the frames.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from paramserver.core.options import Configurable, check_known, describe

# The frame dtypes a payload may carry (bf16 travels as its raw uint16 bits: numpy has none).
FRAME_DTYPES = ("float32", "float16", "uint16", "int8", "uint8")
_FRAME_DTYPE = {d: np.dtype(d).newbyteorder("<") for d in FRAME_DTYPES}


@dataclass(frozen=True)
class Encoded:
    """One encoded vector: the codec's name, the decoded length, header fields and frames."""

    codec: str
    size: int
    meta: tuple[int | float, ...]
    frames: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the frames: what the values cost on the wire beside the small header."""
        return int(sum(f.nbytes for f in self.frames))

    @property
    def bytes_per_value(self) -> float:
        return self.nbytes / self.size if self.size else 0.0

    def to_wire(self) -> tuple[dict[str, Any], list[memoryview]]:
        """The msgpack-able header and the frames' buffers (not copied)."""
        header = {"codec": self.codec, "size": self.size, "meta": list(self.meta),
                  "frames": [[f.dtype.name, int(f.size)] for f in self.frames]}
        return header, [memoryview(np.ascontiguousarray(f)).cast("B") for f in self.frames]

    @classmethod
    def from_wire(cls, header: Any, frames: list) -> Encoded:
        """Check a header and its frames (bad input: ValueError naming what is wrong)."""
        if not isinstance(header, dict) or set(header) != {"codec", "size", "meta", "frames"}:
            raise ValueError(f"encoded header needs codec, size, meta, frames; got {header!r}")
        codec, size, meta, specs = (header[k] for k in ("codec", "size", "meta", "frames"))
        if not isinstance(codec, str) or not _is_count(size):
            raise ValueError(f"encoded header: bad codec {codec!r} or size {size!r}")
        if not isinstance(meta, (list, tuple)) or not all(
                isinstance(m, (int, float)) and not isinstance(m, bool) for m in meta):
            raise ValueError(f"encoded header: meta must be a list of numbers; got {meta!r}")
        if not isinstance(specs, (list, tuple)) or len(specs) != len(frames):
            raise ValueError(f"encoded header announces {specs!r} but {len(frames)} frames "
                             f"follow")
        arrays = []
        for i, (spec, frame) in enumerate(zip(specs, frames)):
            if (not isinstance(spec, (list, tuple)) or len(spec) != 2
                    or spec[0] not in _FRAME_DTYPE or not _is_count(spec[1])):
                raise ValueError(f"frame {i}: bad spec {spec!r} (want [dtype in "
                                 f"{FRAME_DTYPES}, count])")
            dtype = _FRAME_DTYPE[spec[0]]
            buf = memoryview(frame).cast("B")
            if buf.nbytes != spec[1] * dtype.itemsize:
                raise ValueError(f"frame {i}: {buf.nbytes} bytes, expected {spec[1]} x {dtype}")
            arrays.append(np.frombuffer(buf, dtype=dtype))
        return cls(codec, size, tuple(meta), tuple(arrays))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40


def as_f32(x) -> torch.Tensor:
    """A contiguous 1-D float32 tensor of `x` (torch or numpy; shared unless strided)."""
    v = torch.as_tensor(x).detach()
    if v.dim() != 1 or v.dtype != torch.float32:
        raise ValueError(f"a codec takes a 1-D float32 vector; got {v.dim()}-D {v.dtype}")
    return v.contiguous()


def host(t: torch.Tensor) -> np.ndarray:
    """A frame's values on the host: the tensor's own memory on the cpu, else a copy of it
    (the device-to-host copy of a payload, as many bytes as the frame). bfloat16 travels as
    its uint16 bits."""
    if t.dtype == torch.bfloat16:
        return host(t.view(torch.int16)).view(np.uint16)
    return (t if t.device.type == "cpu" else t.cpu()).numpy()


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A frame as a tensor: shared when writable, else copied (torch takes no read-only
    memory, and frames off a socket are read-only)."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def check_finite(codec: str, lo: float, hi: float) -> None:
    """Refuse a vector whose min or max (NaN propagates into both) is not finite."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"codec {codec!r}: the vector holds NaN or inf (min {lo}, max {hi}); "
                         f"a non-finite gradient is refused, not sent")


def min_max(v: torch.Tensor) -> tuple[float, float]:
    """(min, max) in one pass; (0, 0) for an empty vector."""
    if v.numel() == 0:
        return 0.0, 0.0
    lo, hi = torch.aminmax(v)
    return lo.item(), hi.item()


def blocks(v: torch.Tensor, block: int) -> torch.Tensor:
    """`v` as rows of `block` values, the last row padded with zeros (a view when it fits)."""
    n = v.numel()
    rows = -(-n // block)
    if rows * block == n:
        return v.view(rows, block)
    out = torch.zeros(rows * block, dtype=v.dtype, device=v.device)
    out[:n] = v
    return out.view(rows, block)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def unscale(out: np.ndarray, e: int) -> np.ndarray:
    """float32 `out` * 2^-e in place. Near float32's top the rounding before it may carry a
    value just past the largest float: those saturate at +-FLOAT32_MAX, never inf."""
    if e > -100:  # |out| <= 2^16 or so: no product reaches 2^128
        if e:
            out *= np.float32(2.0 ** -e)
        return out
    wide = np.clip(out.astype(np.float64) * 2.0 ** -e, -FLOAT32_MAX, FLOAT32_MAX)
    out[:] = wide
    return out


def times_block_scales(x: np.ndarray, scale: np.ndarray, block: int,
                       out: np.ndarray | None = None) -> np.ndarray:
    """float32 x[i] * scale[i // block], in numpy (frames off the wire may be read-only)."""
    n = x.size
    full = n // block
    cut = full * block
    if out is None:
        out = np.empty(n, np.float32)
    np.multiply(x[:cut].reshape(full, block), scale[:full, None],
                out=out[:cut].reshape(full, block))
    if cut < n:
        np.multiply(x[cut:], scale[full], out=out[cut:])
    return out


class Codec(Configurable):
    """encode(x) -> Encoded; decode(enc, size) -> float32 numpy. Subclasses fill in _encode,
    _decode, and `layout` (the frames a payload of `size` values must have)."""

    name: ClassVar[str] = ""
    Options: ClassVar[type | None] = None
    # True where _encode_decoded is torch ops on any device (frames leave through host()).
    device_native: ClassVar[bool] = False

    def __init__(self, **options):
        check_known(f"codec {self.name!r}", options, describe(self.Options))
        self.opts = self.Options(**options) if self.Options else None
        self.reset()

    def reset(self) -> None:
        """Forget carried state (warm starts, step counters); stateless codecs have none."""

    def options(self) -> dict:
        return asdict(self.opts) if self.opts else {}

    def part(self, lo: int, hi: int) -> "Codec":
        """The codec for the slice [lo, hi) of the vectors this one encodes, where a message
        carries one slice (compression/mixed.py's runs are placed in the whole vector)."""
        return self

    def encode(self, x) -> Encoded:
        v = as_f32(x)
        if not self.device_native and v.device.type != "cpu":
            v = v.cpu()  # encoded on the host: the whole vector crosses first
        return self._encode(v)

    def encode_decoded(self, x):
        """(payload, what it decodes to): the decoded values as `x` is held, numpy for numpy
        and a tensor on x's device for a tensor, so error feedback stays where x is."""
        v = as_f32(x)
        if self.device_native and isinstance(x, torch.Tensor):
            meta, frames = self._tensors(v)
            return (self._payload(v.numel(), meta, *map(host, frames)),
                    self._decoded(meta, frames, v.numel()))
        enc = self.encode(v)
        dec = self.decode(enc, v.numel())
        if isinstance(x, torch.Tensor):
            dec = torch.from_numpy(dec).to(x.device)
        return enc, dec

    def decode(self, enc: Encoded, size: int) -> np.ndarray:
        """The float32 vector `enc` stands for; a payload that does not fit: ValueError."""
        if enc.codec != self.name or enc.size != size:
            raise ValueError(f"codec {self.name!r} expected {size} values, got a {enc.codec!r} "
                             f"payload of {enc.size}")
        want = self.layout(size, enc.meta)
        got = [(f.dtype.name, int(f.size)) for f in enc.frames]
        if got != want:
            raise ValueError(f"codec {self.name!r}: frames {got} do not fit {size} values "
                             f"(want {want})")
        return self._decode(enc)

    def nbytes(self, size: int) -> int:
        """Frame bytes of a payload of `size` values, counted without encoding."""
        return sum(np.dtype(d).itemsize * c for d, c in self.layout(size, None))

    def layout(self, size: int, meta: tuple | None) -> list[tuple[str, int]]:
        """[(dtype, count)] of the frames; `meta` None: as the encoder would write them."""
        raise NotImplementedError

    def _encode(self, v: torch.Tensor) -> Encoded:
        """The payload of `v` (device-native codecs: their tensors' frames, on the host)."""
        if not self.device_native:
            raise NotImplementedError
        meta, frames = self._tensors(v)
        return self._payload(v.numel(), meta, *map(host, frames))

    def _decode(self, enc: Encoded) -> np.ndarray:
        raise NotImplementedError

    # Device-native codecs: the encoding as tensors on v's device, and its decoding there,
    # equal bit for bit to what decode() gives on the host from the same frames.
    def _tensors(self, v: torch.Tensor) -> tuple[tuple, list[torch.Tensor]]:
        raise NotImplementedError

    def _decoded(self, meta: tuple, frames: list[torch.Tensor], size: int) -> torch.Tensor:
        raise NotImplementedError

    def _payload(self, n: int, meta: tuple, *frames: np.ndarray) -> Encoded:
        return Encoded(self.name, n, meta, frames)
