"""Messages <-> ZeroMQ frames: a msgpack header plus raw tensor frames; every field validated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
import numpy as np

from paramserver.core import clipping
from paramserver.core.bounded import nests_past
from paramserver.core.words import shown
from paramserver.wire.protocol import (
    CLIP, DTYPES, FLOAT, INT, MAX_ELEMENTS, MAX_NESTING, MAX_RECORD_FIELDS, MAX_RUNS, NONNEG, OPS,
    PROTOCOL_VERSION, RANGE, RECORD, RUNS, SCHEMAS, STR,
)

MAX_HEADER_BYTES = 64 * 1024


class WireError(ValueError):
    """A frame that does not follow the protocol; the text says what is wrong."""


@dataclass
class Message:
    """One protocol message: op, request id, sender, header fields and tensor payloads."""

    op: str
    fields: dict[str, Any] = field(default_factory=dict)
    arrays: list[np.ndarray] = field(default_factory=list)
    rid: int = 0
    src: str = ""

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


# str(dtype) costs microseconds per call; the codec names a handful of dtypes all day.
_DTYPE_NAME = {np.dtype(d): d for d in DTYPES}
_DTYPE = {d: np.dtype(d) for d in DTYPES}


def encode(msg: Message) -> list:
    """Frames for `msg`: header bytes, then each array's buffer (not copied)."""
    header = {"v": PROTOCOL_VERSION, "op": msg.op, "rid": msg.rid, "src": msg.src, **msg.fields}
    if msg.arrays:
        header["arrays"] = [[_DTYPE_NAME.get(a.dtype) or str(a.dtype), int(a.size)]
                            for a in msg.arrays]
    frames: list = [msgpack.packb(header, use_bin_type=True)]
    for a in msg.arrays:
        if not a.flags.c_contiguous or a.ndim == 0:
            a = np.ascontiguousarray(a)
        frames.append(memoryview(a).cast("B"))
    return frames


def decode(frames: Sequence) -> Message:
    """Parse and validate frames; raises WireError on anything malformed."""
    if not frames:
        raise WireError("empty message")
    header = _unpack_header(_buffer(frames[0]))
    header.pop("v")
    op = header.pop("op")
    rid, src = header.pop("rid"), header.pop("src")
    specs = header.pop("arrays", [])
    _check_fields(op, header)
    arrays = _decode_arrays(specs, frames[1:])
    return Message(op=op, fields=header, arrays=arrays, rid=rid, src=src)


def reply_error(request_rid: int, src: str, text: str, code: str = "bad_request") -> Message:
    return Message("error", {"msg": text, "code": code}, rid=request_rid, src=src)


def _buffer(frame) -> memoryview:
    buf = getattr(frame, "buffer", frame)
    try:
        return memoryview(buf)
    except TypeError:
        raise WireError(f"frame of type {type(frame).__name__} is not a buffer") from None


def _unpack_header(raw: memoryview) -> dict:
    if raw.nbytes > MAX_HEADER_BYTES:
        raise WireError(f"header of {raw.nbytes} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=0,
                                 max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"header is not valid msgpack: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise WireError("header is not a map")
    version = header.get("v")
    if version != PROTOCOL_VERSION:
        raise WireError(f"protocol version {shown(version)} not supported; this peer speaks "
                        f"version {PROTOCOL_VERSION}")
    op = header.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise WireError(f"unknown op {shown(op)}")
    if not _is_int(header.get("rid")) or header["rid"] < 0:
        raise WireError("rid must be a non-negative integer")
    if not isinstance(header.get("src"), str) or len(header["src"]) > 128:
        raise WireError("src must be a string of at most 128 characters")
    return header


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_value(name: str, kind, value) -> None:
    if kind == RANGE:
        ok = (isinstance(value, (list, tuple)) and len(value) == 2
              and _is_int(value[0]) and _is_int(value[1]) and 0 <= value[0] <= value[1] < 1 << 62)
        if not ok:
            raise WireError(f"field {name!r} must be [lo, hi] with 0 <= lo <= hi, "
                            f"got {shown(value)}")
        return
    if kind == RUNS:
        if not _are_runs(value):
            raise WireError(f"field {name!r} must be at most {MAX_RUNS} key ranges [[lo, hi], "
                            f"...] with 0 <= lo < hi, sorted and not overlapping, got "
                            f"{shown(value)}")
        return
    if kind == RECORD:
        ok = (isinstance(value, dict) and len(value) <= MAX_RECORD_FIELDS
              and all(isinstance(k, str) and len(k) <= 64 for k in value)
              and all(v is None or isinstance(v, (int, float, str)) and
                      (not isinstance(v, str) or len(v) <= 256) for v in value.values()))
        if not ok:
            raise WireError(f"field {name!r} must be a flat map of at most {MAX_RECORD_FIELDS} "
                            f"str -> number/str/None entries")
        return
    if kind == CLIP:
        try:
            clipping.setting(value)
        except ValueError as exc:
            raise WireError(f"field {name!r}: {exc}") from None
        return
    if kind == NONNEG:
        if not _is_int(value) or not 0 <= value < _INT_END:
            raise WireError(f"field {name!r} must be an integer in [0, 2^62), got {shown(value)}")
        return
    if isinstance(value, (list, tuple, dict)) and nests_past(value, MAX_NESTING):
        raise WireError(f"field {name!r} nests deeper than {MAX_NESTING} levels")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise WireError(f"field {name!r} has type bool")
    if not isinstance(value, kinds):
        raise WireError(f"field {name!r} has type {type(value).__name__}")
    if isinstance(value, float) and not -_INF < value < _INF:
        raise WireError(f"field {name!r} must be a finite number, got "
                        f"{'NaN' if value != value else value}")
    if _is_int(value) and not -_INT_END < value < _INT_END:
        raise WireError(f"field {name!r} is {shown(value)}: integers must lie within +-2^62")


def _are_runs(value) -> bool:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_RUNS:
        return False
    end = 0
    for r in value:
        if not (isinstance(r, (list, tuple)) and len(r) == 2 and _is_int(r[0])
                and _is_int(r[1]) and end <= r[0] < r[1] < _RANGE_END):
            return False
        end = r[1]
    return True


_MISSING = object()
_RANGE_END = 1 << 62
# Integers beyond +-2^62 and non-finite floats are refused: no count, step or time is that
# large, and they would overflow int64 arrays (checkpoints) or poison sums downstream.
_INT_END = 1 << 62
_INF = float("inf")


def _plainly_valid(kind, value) -> bool:
    """The common well-formed values, accepted without _check_value's general tests (msgpack
    yields plain ints and floats); anything else goes through _check_value, which names the
    fault. Every message passes here, so it is kept to a few type tests."""
    tv = type(value)
    if kind == NONNEG:
        return tv is int and 0 <= value < _INT_END
    if kind == RANGE:
        return (tv is list and len(value) == 2 and type(value[0]) is int
                and type(value[1]) is int and 0 <= value[0] <= value[1] < _RANGE_END)
    if kind is STR:
        return tv is str
    if kind is INT or kind == FLOAT:
        return (tv is int and -_INT_END < value < _INT_END
                or kind == FLOAT and tv is float and -_INF < value < _INF)
    return False


def _check_fields(op: str, fields: dict) -> None:
    schema = SCHEMAS[op]
    known = 0
    for name, (kind, required) in schema.items():
        value = fields.get(name, _MISSING)
        if value is _MISSING:
            if required:
                raise WireError(f"op {op!r} needs field {name!r}")
            continue
        known += 1
        if not _plainly_valid(kind, value):
            _check_value(name, kind, value)
    if known != len(fields):
        unknown = set(fields) - set(schema)
        raise WireError(f"op {op!r} has unknown fields {shown(sorted(unknown))}")


def _decode_arrays(specs, frames: Sequence) -> list[np.ndarray]:
    if not isinstance(specs, list) or len(specs) != len(frames):
        raise WireError(f"header announces {len(specs) if isinstance(specs, list) else '?'} "
                        f"arrays but {len(frames)} frames follow")
    arrays = []
    for i, (spec, frame) in enumerate(zip(specs, frames)):
        if (not isinstance(spec, list) or len(spec) != 2 or spec[0] not in DTYPES
                or not _is_int(spec[1]) or not 0 <= spec[1] <= MAX_ELEMENTS):
            raise WireError(f"array {i}: bad spec {shown(spec)} (want [dtype in {DTYPES}, count])")
        dtype = _DTYPE[spec[0]]
        buf = _buffer(frame)
        if buf.nbytes != spec[1] * dtype.itemsize:
            raise WireError(f"array {i}: {buf.nbytes} bytes, expected {spec[1]} x {dtype}")
        arrays.append(np.frombuffer(buf, dtype=dtype))
    return arrays
