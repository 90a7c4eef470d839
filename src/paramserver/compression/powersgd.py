"""`powersgd`: a rank-r approximation P Q^T by one warm-started power step (Vogels et al. 2019).

The flat vector becomes a matrix row-major: `cols` columns (0: ceil(sqrt(n)), near square),
rows = ceil(n / cols), the tail of the last row padded with zeros (and dropped on decode).
Each encode: P = M Q (Q carried from the last encode: the warm start), P orthonormalized (QR),
Q = M^T P; the payload is P (rows x r) and Q (cols x r) as float32, r = min(rank, rows, cols),
and a power of two e (header) that scaled M to max |M| in [0.5, 1) for the products.
decode = P Q^T, the projection of M onto span(P): no bound per value, but in Frobenius norm
||M - d||^2 + ||d||^2 == ||M||^2, an M of rank <= r comes back exactly (up to rounding), and
repeated steps on one M converge to its best rank-r approximation. Q starts (and restarts,
should a column vanish) from a seeded normal draw; its shape changing restarts it too.
Bytes per value: 4 r (rows + cols) / n, about 8 r / sqrt(n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from paramserver.compression.casts import MAX_EXP
from paramserver.compression.codec import Codec, blocks, check_finite, min_max, unscale
from paramserver.core.options import check_int, opt


# Within 2^+-64 of 1, M's products with the thin P and Q stay far inside float32's range, so
# the 2^e can go on them instead of on a scaled copy of M.
SMALL_MATRIX_EXP = 64


@dataclass(frozen=True)
class PowerSGDOptions:
    rank: int = opt(4, "rank r of the approximation (P is rows x r, Q cols x r)")
    cols: int = opt(0, "columns of the matrix the flat vector is read as, row-major (0: "
                       "ceil(sqrt(n)), near square; a layer's own width fits best)")
    seed: int = opt(0, "seed of Q's first (and any restarted) draw")

    def __post_init__(self):
        check_int("rank", self.rank, 1)
        check_int("cols", self.cols, 0)
        check_int("seed", self.seed, 0)


class PowerSGD(Codec):
    name = "powersgd"
    Options = PowerSGDOptions

    def reset(self) -> None:
        self._gen = torch.Generator().manual_seed(self.opts.seed)
        self.q: torch.Tensor | None = None  # the warm start: cols x r

    def shape(self, n: int) -> tuple[int, int, int]:
        """(rows, cols, r) of the matrix a vector of n values is read as."""
        if n == 0:
            return 0, 0, 0
        cols = min(n, self.opts.cols or math.isqrt(n - 1) + 1)
        rows = -(-n // cols)
        return rows, cols, min(self.opts.rank, rows, cols)

    def layout(self, size, meta):
        rows, cols, r = self.shape(size)
        if meta is not None and (len(meta) != 4 or tuple(meta[:3]) != (rows, cols, r)
                                 or not isinstance(meta[3], int) or abs(meta[3]) > MAX_EXP):
            raise ValueError(f"codec {self.name!r}: meta {meta!r} is not [rows, cols, rank, "
                             f"exponent] for the shape {(rows, cols, r)} of {size} values")
        return [("float32", rows * r), ("float32", cols * r)]

    def _encode(self, v):
        n = v.numel()
        lo, hi = min_max(v)
        check_finite(self.name, lo, hi)
        rows, cols, r = self.shape(n)
        if n == 0:
            return self._payload(0, (0, 0, 0, 0), np.empty(0, np.float32),
                                 np.empty(0, np.float32))
        # Work on M * 2^e with max |M| * 2^e in [0.5, 1): the products neither overflow nor
        # sink into subnormals whatever the gradient's scale; Q carries the 2^e (exactly).
        amax = max(-lo, hi)
        e = 0 if amax == 0 else max(-MAX_EXP, min(MAX_EXP, -math.frexp(amax)[1]))
        m = blocks(v, cols)
        q = self.q
        if q is None or q.shape != (cols, r) or not bool((q.norm(dim=0) > 0).all()):
            q = torch.randn(cols, r, generator=self._gen)
        if abs(e) <= SMALL_MATRIX_EXP:
            # Scale the thin matrices, not M: QR ignores P's scale, Q takes 2^e after.
            p = torch.linalg.qr(m @ q.mul(2.0 ** e)).Q.contiguous()
            self.q = (m.T @ p).mul_(2.0 ** e).contiguous()
        else:
            m = m * 2.0 ** e
            p = torch.linalg.qr(m @ q).Q.contiguous()
            self.q = (m.T @ p).contiguous()
        return self._payload(n, (rows, cols, r, e), p.view(-1).numpy(),
                             self.q.view(-1).numpy())

    def _decode(self, enc):
        rows, cols, r, e = enc.meta
        # P and Q are small: copies make them writable whatever buffer they came in.
        p = torch.tensor(enc.frames[0]).view(rows, r)
        q = torch.tensor(enc.frames[1]).view(cols, r)
        return unscale((p @ q.T).view(-1)[:enc.size].numpy(), e)
