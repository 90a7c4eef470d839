"""Codec-encoded values in a message (issue 22): pushes and delta pulls carry an `Encoded`.

A message with codec values names them in two header fields beside its own:
    enc:      the Encoded header {"codec", "size", "meta", "frames": [[dtype, count], ...]}
    enc_opts: the codec's options ({} for the defaults), so the receiver builds the same codec
and carries the payload's frames as raw uint8 array frames (after any keys). The receiver
trusts none of it: the header is checked by Encoded.from_wire, the options by the codec's own
Options, the frames' sizes by the codec's layout, and the decoded values must be finite (a
lying fp32 or scale frame could hold NaN, which would spread through float32 master values).
Every fault is a ValueError naming it; decoding keeps no state (each message builds its codec:
microseconds, and a stream of odd options cannot grow a cache).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paramserver.compression import make_codec
from paramserver.compression.codec import Codec, Encoded

MAX_OPTIONS = 8


def pack(codec: Codec, values: np.ndarray) -> tuple[dict, list[np.ndarray]]:
    """(header fields, uint8 frames) for `values` (1-D float32) encoded by `codec`."""
    return as_fields(codec, codec.encode(values))


def as_fields(codec: Codec, enc: Encoded) -> tuple[dict, list[np.ndarray]]:
    header, frames = enc.to_wire()
    return ({"enc": header, "enc_opts": codec.options()},
            [np.frombuffer(f, dtype=np.uint8) for f in frames])


def frame_bytes(frames: list[np.ndarray]) -> int:
    return int(sum(f.nbytes for f in frames))


def codec_of(name: Any, opts: Any) -> Codec:
    """The codec a message names, built from its options (checked: ValueError)."""
    if not isinstance(name, str):
        raise ValueError(f"codec name must be a string; got {name!r}")
    if not isinstance(opts, dict) or len(opts) > MAX_OPTIONS or not all(
            isinstance(k, str) and isinstance(v, (bool, int, float, str))
            for k, v in opts.items()):
        raise ValueError(f"codec options must be a map of at most {MAX_OPTIONS} names to "
                         f"numbers, strings or booleans; got {opts!r}")
    try:
        return make_codec(name, **opts)
    except TypeError as exc:  # an option of the wrong type that its dataclass did not check
        raise ValueError(f"codec {name!r}: bad options {opts!r}: {exc}") from None


def unpack(fields: dict, frames: list, size: int) -> np.ndarray:
    """The float32 values of `size` a message's `enc`/`enc_opts` and frames stand for."""
    header = fields.get("enc")
    if not isinstance(header, dict):
        raise ValueError(f"codec payload needs an 'enc' header map; got {header!r}")
    codec = codec_of(header.get("codec"), fields.get("enc_opts", {}))
    enc = Encoded.from_wire(header, list(frames))
    values = codec.decode(enc, size)
    if values.dtype != np.float32 or values.shape != (size,):
        raise ValueError(f"codec {codec.name!r} decoded {values.shape} {values.dtype}, "
                         f"want ({size},) float32")
    if size and not np.isfinite(values).all():
        raise ValueError(f"codec {codec.name!r} payload decodes to NaN or inf: refused")
    return values
