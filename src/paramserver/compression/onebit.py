"""`sign`: one bit a value, scaled per block by the block's mean |x| (EF-signSGD's scaling).

Decode gives +m or -m for each value of a block whose mean |x| is m; the bit sent is the
float's sign bit, so 0.0 decodes to +m and -0.0 to -m.
Bound: |d - x| = ||x| - m| <= max(m, max|x| - m) <= max|x| of the block,
with the sign kept for every nonzero x and the block's sum of |d| equal to its sum of |x|.
Meant for error feedback (Karimireddy et al. 2019): without it the sign alone is biased.
Bytes per value: 1/8 + 4 / block (bits packed little-endian, np.packbits).
"""

from __future__ import annotations

import numpy as np
import torch

from paramserver.compression.codec import (Codec, blocks, check_finite, min_max,
                                           times_block_scales)
from paramserver.compression.quant8 import BlockOptions

FLOAT32_MAX = float(torch.finfo(torch.float32).max)

_LEAST = torch.tensor(np.finfo(np.float32).smallest_subnormal)


class Sign(Codec):
    name = "sign"
    Options = BlockOptions

    def layout(self, size, meta):
        return [("uint8", -(-size // 8)), ("float32", -(-size // self.opts.block))]

    def _encode(self, v):
        n = v.numel()
        lo, hi = min_max(v)
        check_finite(self.name, lo, hi)
        if n == 0:
            return self._payload(0, (), np.empty(0, np.uint8), np.empty(0, np.float32))
        block = self.opts.block
        xb = blocks(v, block)
        counts = torch.full((xb.shape[0],), float(block))
        counts[-1] = n - (xb.shape[0] - 1) * block  # the padded zeros add nothing to |x|
        # A block's sum of |x| overflows float32 near its top; only then sum in float64.
        wide = max(-lo, hi) * block > FLOAT32_MAX
        sums = (xb.double() if wide else xb).abs().sum(dim=1)
        scale = sums.div(counts).float()
        # A block of subnormals only can average below float32's least value: it keeps that
        # least value, not 0 (which would lose the signs).
        scale = torch.where((scale == 0) & (sums > 0), _LEAST, scale)
        bits = np.packbits(np.signbit(v.numpy()), bitorder="little")
        return self._payload(n, (), bits, scale.numpy())

    def _decode(self, enc):
        bits, scale = enc.frames
        n = enc.size
        if n == 0:
            return np.empty(0, np.float32)
        # bit 0/1 -> +1/-1 as 1 - 2b, in torch: numpy's take of a two-entry table was ~10x slower.
        signs = torch.from_numpy(np.unpackbits(bits, count=n, bitorder="little")).float()
        signs = signs.mul_(-2).add_(1).numpy()
        return times_block_scales(signs, scale, self.opts.block, out=signs)
