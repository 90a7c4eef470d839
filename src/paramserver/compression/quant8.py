"""8-bit codecs: uniform with a scale per block, and quantile (hivemind-style, 256 levels).

Error bounds (x float32, d = decode(encode(x))):
- uniform8:  per block of `block` values, s = max|x| / 127 (sent as float32) and q =
             round(x / s) in [-127, 127] (int8): |d - x| <= s / 2, plus float32 rounding
             (at most 2^-16 s, and 2^-142 where s is subnormal). An all-zero block decodes to
             zeros. Bytes per value: 1 + 4 / block.
- quantile8: 256 levels (fewer when there are fewer values) from the quantiles of a strided
             sample of at most `sample` values; each value gets the code of its nearest level
             (bucketize on the midpoints, so codes are monotone in x), and the level sent for
             a code is the mean of the values that got it (summed in float64, kept inside its
             bucket), so the sum of each code's values is kept. Bound: d lies within the
             [min, max] of the inputs sharing x's code (up to float32 rounding of the mean):
             |d - x| <= that spread. Bytes per value: 1 + 1024 / n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paramserver.compression.codec import (Codec, as_tensor, blocks, check_finite, min_max,
                                           times_block_scales)
from paramserver.core.options import check_int, opt

LEVELS = 256
# Values coded per pass of quantile8's loop: its temporaries stay in cache.
CHUNK = 1 << 16


@dataclass(frozen=True)
class BlockOptions:
    block: int = opt(256, "values per scale: smaller blocks follow the magnitudes more closely "
                          "and cost 4 bytes a block more")

    def __post_init__(self):
        check_int("block", self.block, 1)


@dataclass(frozen=True)
class QuantileOptions:
    sample: int = opt(65536, "values (a strided sample) the 256 quantile levels are taken from")

    def __post_init__(self):
        check_int("sample", self.sample, LEVELS)


class Uniform8(Codec):
    """int8 codes, symmetric around zero, one float32 scale per block."""

    name = "uniform8"
    Options = BlockOptions
    device_native = True

    def reset(self) -> None:
        self._work = torch.empty(0)

    def _scratch(self, size: int, device: torch.device) -> torch.Tensor:
        """A float32 buffer kept across calls: fresh pages cost about a pass each time."""
        if self._work.numel() != size or self._work.device != device:
            self._work = torch.empty(size, device=device)
        return self._work

    def layout(self, size, meta):
        return [("int8", size), ("float32", -(-size // self.opts.block))]

    def _tensors(self, v):
        n = v.numel()
        if n == 0:
            return (), [torch.empty(0, dtype=torch.int8, device=v.device),
                        torch.empty(0, dtype=torch.float32, device=v.device)]
        xb = blocks(v, self.opts.block)
        work = self._scratch(xb.numel(), v.device).view_as(xb)
        amax = torch.abs(xb, out=work).amax(dim=1)  # 3-5x faster than aminmax(dim=1)
        top = amax.max().item()  # NaN in any block reaches here
        check_finite(self.name, -top, top)
        scale = amax / 127
        # Where amax / 127 rounded up, 127 * scale may pass float32's top: step it down.
        scale = torch.where(scale * 127 == torch.inf, torch.nextafter(scale, amax.new_zeros(())),
                            scale)
        safe = torch.where(scale > 0, scale, 1.0)
        # Division, not a reciprocal: 127 / max|x| overflows for subnormal blocks.
        q = torch.div(xb, safe[:, None], out=work).round_().clamp_(-127, 127).to(torch.int8)
        return (), [q.view(-1)[:n], scale]

    def _decoded(self, meta, frames, size):
        q, scale = frames
        if size == 0:
            return q.float()
        return blocks(q.float(), self.opts.block).mul_(scale[:, None]).view(-1)[:size]

    def _decode(self, enc):
        q, scale = enc.frames
        return times_block_scales(q, scale, self.opts.block)


class BucketFinder:
    """torch.bucketize(x, borders) (the count of borders < x) for sorted float32 borders,
    vectorized: torch's bucketize is a scalar binary search per value, ~150 ns each here.

    A float32's top 16 bits name a bf16 cell (an interval 2^-7 wide relative to its values);
    a table gives the count of borders below each cell, and a branchless binary search over
    the borders inside the cell (`steps` rounds: none when no cell holds two borders' worth
    of ambiguity, 8 at worst) finishes the count. Finite values only."""

    def __init__(self, borders: torch.Tensor):
        # -0.0 + 0.0 is +0.0: sorted borders must also be sorted by their bits' cells.
        borders = borders + 0.0
        # The 64K-entry tables in numpy: torch's parallel kernels on tensors this small took
        # 10+ ms each on this loaded 2-core machine, numpy's microseconds.
        keys = borders.numpy().view(np.int32) >> 16
        cells = keys ^ ((keys >> 31) | 0x8000)  # cell order is value order (negatives flip)
        per_cell = np.bincount(cells, minlength=1 << 16)
        below = np.cumsum(per_cell) - per_cell  # borders in cells before each cell
        # Indexed by the raw prefix + 32768, so a value needs no flip of its own.
        prefix = np.arange(-(1 << 15), 1 << 15, dtype=np.int32)
        self.below = torch.from_numpy(below[prefix ^ ((prefix >> 31) | 0x8000)].astype(np.int32))
        span = int(per_cell.max()) if borders.numel() else 0
        self.steps = [1 << i for i in reversed(range(span.bit_length()))]
        self.borders = torch.cat([borders, torch.full((max(self.steps, default=0),), torch.inf)])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        base = self.below.index_select(0, (x.view(torch.int32) >> 16).add_(1 << 15))
        for step in self.steps:
            probe = self.borders.index_select(0, base + (step - 1))
            base.add_(torch.lt(probe, x).int().mul_(step))
        return base


class Quantile8(Codec):
    """uint8 codes into a table of up to 256 float32 levels (the codes' means)."""

    name = "quantile8"
    Options = QuantileOptions

    def layout(self, size, meta):
        return [("uint8", size), ("float32", min(LEVELS, size))]

    def levels(self, v: torch.Tensor) -> torch.Tensor:
        """Up to 256 quantiles (sorted, the sample's min and max among them)."""
        n = v.numel()
        stride = max(1, n // self.opts.sample)
        # numpy's SIMD sort: 0.3 ms for 64K floats here against torch.sort's 10-14 ms.
        sample = torch.from_numpy(np.sort(v.numpy()[::stride]))
        pos = torch.linspace(0, sample.numel() - 1, min(LEVELS, n)).round().long()
        return sample[pos]

    def _encode(self, v):
        n = v.numel()
        if n == 0:
            return self._payload(0, (), np.empty(0, np.uint8), np.empty(0, np.float32))
        lo, hi = min_max(v)
        check_finite(self.name, lo, hi)
        levels = self.levels(v)
        borders = levels[1:] / 2 + levels[:-1] / 2  # a sum of two near 3e38 would overflow
        count = levels.numel()
        codes = torch.empty(n, dtype=torch.uint8)
        sums = torch.zeros(count, dtype=torch.float64)
        hits = torch.zeros(count, dtype=torch.int64)
        finder = BucketFinder(borders)
        for start in range(0, n, CHUNK):
            chunk = v[start:start + CHUNK]
            c = finder(chunk)
            hits += torch.bincount(c, minlength=count)
            sums += torch.bincount(c, weights=chunk.double(), minlength=count)
            codes[start:start + CHUNK] = c
        # A code's values lie in its bucket (between the neighbouring borders); so does their
        # mean, barring rounding, which the clamp takes back.
        low = torch.cat([torch.tensor([lo], dtype=torch.float64), borders.double()])
        high = torch.cat([borders.double(), torch.tensor([hi], dtype=torch.float64)])
        means = (sums / hits.clamp(min=1)).clamp(low, high)
        table = torch.where(hits > 0, means, levels.double()).float()
        return self._payload(n, (), codes.numpy(), table.numpy())

    def _decode(self, enc):
        codes, table = enc.frames
        if codes.size and int(codes.max()) >= table.size:
            raise ValueError(f"codec {self.name!r}: code {int(codes.max())} beyond the "
                             f"{table.size} levels")
        # index_select with int32 indices: numpy's take of uint8 codes was ~4x slower.
        return as_tensor(table).index_select(0, torch.from_numpy(codes.astype(np.int32))).numpy()
