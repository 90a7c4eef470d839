"""Casting codecs: fp32 (identity), fp16, scaled fp16 and bf16. Round to nearest even.

Error bounds (x float32, d = decode(encode(x))):
- fp32:        d == x.
- fp16:        |d - x| <= 2^-11 |x| where 2^-14 <= |x| <= 65504 (fp16's normal range);
               |d - x| <= 2^-25 below it (fp16 subnormals). Above 65504 it saturates:
               d = sign(x) * 65504 (never inf), the excess is the error (error feedback keeps
               it in the residual).
- fp16-scaled: x * 2^e is cast, e chosen per vector so max |x| * 2^e lies in [2^14, 2^15):
               a power of two changes no bit, and every value down to max|x| * 2^-28 keeps
               fp16's full relative precision: |d - x| <= max(2^-11 |x|, 2^-39 max|x|) plus
               float32's own subnormal step 2^-149. The header carries e (one int).
- bf16:        |d - x| <= 2^-8 |x| for normal x (same exponent range as float32), <= 2^-133
               for subnormals; saturates at bf16's largest finite value like fp16.
Bytes per value: 4, 2, 2, 2.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from paramserver.compression.codec import (FLOAT32_MAX, Codec, Encoded, as_tensor, check_finite,
                                           min_max, unscale)

FP16_MAX = 65504.0
BF16_MAX = float(torch.finfo(torch.bfloat16).max)
# Scaled fp16: max |x| * 2^e lands in [2^14, 2^15), clear of the overflow above 65504.
SCALED_TOP = 14
# float32 holds 2^-126..2^127: e stays where 2^e and 2^-e are both normal floats.
MAX_EXP = 126


def _saturated(v: torch.Tensor, lo: float, hi: float, top: float) -> torch.Tensor:
    """`v` clamped to [-top, top] when it reaches beyond (a copy only then)."""
    return v.clamp(-top, top) if max(-lo, hi) > top else v


class Fp32(Codec):
    """Identity: float32 as it is (4 bytes a value); the reference the others are held to."""

    name = "fp32"
    device_native = True

    def layout(self, size, meta):
        return [("float32", size)]

    def _tensors(self, v):
        lo, hi = min_max(v)
        check_finite(self.name, lo, hi)
        return (), [v.clone()]  # a snapshot, like the rest

    def _decoded(self, meta, frames, size):
        return frames[0]

    def _decode(self, enc):
        return enc.frames[0].astype(np.float32, copy=True)


class Fp16(Codec):
    """IEEE half precision, saturating at +-65504 (2 bytes a value)."""

    name = "fp16"
    device_native = True

    def layout(self, size, meta):
        return [("float16", size)]

    def _tensors(self, v):
        lo, hi = min_max(v)
        check_finite(self.name, lo, hi)
        return (), [_saturated(v, lo, hi, FP16_MAX).half()]

    def _decoded(self, meta, frames, size):
        return frames[0].float()

    def _decode(self, enc):
        # torch's half -> float beat numpy's 3-6x here (1M values, one core).
        return as_tensor(enc.frames[0]).float().numpy()


class ScaledFp16(Codec):
    """fp16 of x * 2^e, e per vector from max |x| (2 bytes a value + one int of header)."""

    name = "fp16-scaled"
    device_native = True

    def reset(self) -> None:
        self._work = torch.empty(0)

    def layout(self, size, meta):
        if meta is not None and (len(meta) != 1 or not isinstance(meta[0], int)
                                 or abs(meta[0]) > MAX_EXP):
            raise ValueError(f"codec {self.name!r}: meta must be [exponent]; got {meta!r}")
        return [("float16", size)]

    @staticmethod
    def exponent(amax: float) -> int:
        """e with amax * 2^e in [2^14, 2^15), within float32's normal powers of two."""
        if amax == 0:
            return 0
        return max(-MAX_EXP, min(MAX_EXP, SCALED_TOP - math.frexp(amax)[1] + 1))

    def _tensors(self, v):
        lo, hi = min_max(v)
        check_finite(self.name, lo, hi)
        e = self.exponent(max(-lo, hi))
        # The product is exact (a power of two); the cast is the only rounding.
        if e:
            w = self._work
            if w.numel() != v.numel() or w.device != v.device:  # fresh pages cost a pass
                self._work = w = torch.empty_like(v)
            v = torch.mul(v, 2.0 ** e, out=w)
        return (e,), [v.half()]

    def _decoded(self, meta, frames, size):
        (e,) = meta
        out = frames[0].float()
        if e > -100:  # as unscale(): no product reaches float32's top
            return out.mul_(2.0 ** -e) if e else out
        return (out.double() * 2.0 ** -e).clamp_(-FLOAT32_MAX, FLOAT32_MAX).float()

    def _decode(self, enc):
        return unscale(as_tensor(enc.frames[0]).float().numpy(), enc.meta[0])


class Bf16(Codec):
    """bfloat16: float32's exponent, 8 significant bits (2 bytes a value, as uint16 bits)."""

    name = "bf16"
    device_native = True

    def layout(self, size, meta):
        return [("uint16", size)]

    def _tensors(self, v):
        lo, hi = min_max(v)
        check_finite(self.name, lo, hi)
        return (), [_saturated(v, lo, hi, BF16_MAX).to(torch.bfloat16)]  # sent as uint16 bits

    def _decoded(self, meta, frames, size):
        return frames[0].float()

    def _decode(self, enc):
        # bf16 is float32's upper half: shift the bits back into place.
        return np.left_shift(enc.frames[0], 16, dtype=np.uint32).view(np.float32)


CAST_CODECS: dict[str, type[Codec]] = {c.name: c for c in (Fp32, Fp16, ScaledFp16, Bf16)}
__all__ = ["BF16_MAX", "Bf16", "CAST_CODECS", "Encoded", "FP16_MAX", "Fp16", "Fp32",
           "ScaledFp16"]
