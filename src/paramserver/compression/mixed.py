"""`mixed`: some runs of a vector as float32, the rest through another codec (issue 22's
per-tensor choice: `--compress auto` keeps a model's small tensors, its biases, dense inside a
push whose large tensors go as bf16 or uniform8).

The runs kept dense are the sender's: `dense_runs(runs)` gives them in the vector's
coordinates (a model's small tensors, by the key layout), and `part(lo, hi)` is the codec for
one message's slice of it (a chunk, a shard's piece), its runs clipped and shifted, so every
message decodes alone. The payload names its runs, so a receiver needs only the options:

    meta   = [r, start_1, stop_1, ..., start_r, stop_r, *the inner payload's meta]
    frames = [float32 of the runs' values, in order, *the inner payload's frames]

Bound: the runs exact; the rest within the inner codec's bound. Bytes: 4 per value in the
runs, the inner codec's for the rest. Without runs it is the inner codec plus an empty frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paramserver.compression.codec import Codec, Encoded
from paramserver.core.options import check_int, opt

MAX_RUNS = 4096  # runs one payload may name: a receiver checks each


@dataclass(frozen=True)
class MixedOptions:
    inner: str = opt("uniform8", "the codec of the values outside the dense runs (with its "
                                 "default options)")
    dense_below: int = opt(0, "what the sender keeps dense: tensors of fewer values (told "
                              "to the receiver for the record; the payload names its runs)")

    def __post_init__(self):
        from paramserver.compression import CODECS
        if self.inner == MixedCodec.name or self.inner not in CODECS:
            raise ValueError(f"inner must be a codec other than {MixedCodec.name}; known: "
                             f"{', '.join(n for n in CODECS.names() if n != MixedCodec.name)}; "
                             f"got {self.inner!r}")
        check_int("dense_below", self.dense_below, 0)


def runs_of(sizes, dense_below: int) -> tuple[tuple[int, int], ...]:
    """[start, stop) of each tensor of fewer than `dense_below` values, for tensors of `sizes`
    laid end to end (key order), adjacent ones merged."""
    out: list[list[int]] = []
    at = 0
    for n in sizes:
        if n < dense_below and n > 0:
            if out and out[-1][1] == at:
                out[-1][1] = at + n
            else:
                out.append([at, at + n])
        at += n
    return tuple((a, b) for a, b in out)


class MixedCodec(Codec):
    """Runs as float32, the rest through `inner` (see the module's text)."""

    name = "mixed"
    Options = MixedOptions

    def reset(self) -> None:
        from paramserver.compression import make_codec
        self.inner = make_codec(self.opts.inner)
        self.runs: tuple[tuple[int, int], ...] = ()

    def dense_runs(self, runs) -> "MixedCodec":
        """Keep [start, stop) runs of the vectors it encodes dense (sorted, disjoint)."""
        self.runs = _checked(tuple((int(a), int(b)) for a, b in runs), None)
        return self

    def part(self, lo: int, hi: int) -> "MixedCodec":
        """The codec for the slice [lo, hi) of the vectors: runs clipped and shifted (the
        inner codec, and any state it carries, shared)."""
        if not self.runs:
            return self
        p = object.__new__(MixedCodec)
        p.opts, p.inner = self.opts, self.inner
        p.runs = tuple((max(a, lo) - lo, min(b, hi) - lo) for a, b in self.runs
                       if a < hi and b > lo)
        return p

    def layout(self, size, meta):
        runs, inner_meta = (self._clipped(size), None) if meta is None else _parse(meta, size)
        dense = sum(b - a for a, b in runs)
        return [("float32", dense)] + self.inner.layout(size - dense, inner_meta)

    def _clipped(self, size: int) -> tuple[tuple[int, int], ...]:
        return tuple((a, min(b, size)) for a, b in self.runs if a < size)

    def _encode(self, v):
        n = v.numel()
        runs = self._clipped(n)
        x = v.numpy()
        dense = np.concatenate([x[a:b] for a, b in runs]) if runs else np.empty(0, np.float32)
        if dense.size and not np.isfinite(dense).all():
            raise ValueError(f"codec {self.name!r}: the vector holds NaN or inf; a non-finite "
                             f"gradient is refused, not sent")
        gaps = _gaps(runs, n)
        rest = x if not runs else (np.concatenate([x[a:b] for a, b in gaps]) if gaps
                                   else np.empty(0, np.float32))
        enc = self.inner.encode(torch.from_numpy(rest))
        meta = (len(runs), *[i for r in runs for i in r], *enc.meta)
        return self._payload(n, meta, dense.astype(np.float32, copy=True), *enc.frames)

    def _decode(self, enc):
        runs, inner_meta = _parse(enc.meta, enc.size)
        dense = sum(b - a for a, b in runs)
        rest = self.inner.decode(Encoded(self.inner.name, enc.size - dense, inner_meta,
                                         enc.frames[1:]), enc.size - dense)
        if not runs:
            return rest
        out = np.empty(enc.size, np.float32)
        at = 0
        for a, b in runs:
            out[a:b] = enc.frames[0][at:at + b - a]
            at += b - a
        at = 0
        for a, b in _gaps(runs, enc.size):
            out[a:b] = rest[at:at + b - a]
            at += b - a
        return out


def _gaps(runs, n: int) -> list[tuple[int, int]]:
    """The complement of `runs` in [0, n)."""
    out, at = [], 0
    for a, b in runs:
        if a > at:
            out.append((at, a))
        at = b
    if at < n:
        out.append((at, n))
    return out


def _parse(meta, size: int):
    """(runs, the inner meta) of a payload's meta; a bad one: ValueError."""
    if not meta or not isinstance(meta[0], int) or not 0 <= meta[0] <= MAX_RUNS \
            or len(meta) < 1 + 2 * meta[0]:
        raise ValueError(f"codec 'mixed': meta must start with a run count (<= {MAX_RUNS}) and "
                         f"its runs; got {list(meta)[:8]!r}")
    r = meta[0]
    return _checked(tuple(zip(meta[1:1 + 2 * r:2], meta[2:2 + 2 * r:2])), size), \
        tuple(meta[1 + 2 * r:])


def _checked(runs, size: int | None):
    at = 0
    for a, b in runs:
        if not (isinstance(a, int) and isinstance(b, int)) or a < at or b <= a \
                or (size is not None and b > size):
            raise ValueError(f"codec 'mixed': runs must be sorted, disjoint [start, stop) "
                             f"within the vector; got {list(runs)[:8]!r}")
        at = b
    return runs
