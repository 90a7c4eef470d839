"""The compressor skeleton: input checks, error feedback / momentum state, selection, stats."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar, NamedTuple

import numpy as np
import torch

from paramserver.compression.codec import Codec
from paramserver.compression.feedback import make_feedback
from paramserver.compression.sparse import Sparse
from paramserver.core.options import Configurable, check_known, check_range, describe, opt

FLOAT_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class FeedbackOptions:
    error_feedback: bool = opt(True, "keep the unsent part in a local residual and add it to the "
                                     "next gradient (False: drop it)")
    momentum: float = opt(0.0, "DGC momentum correction factor m in [0, 1): u = m*u + g, "
                               "residual += u, clear both where sent (0 = off; needs "
                               "error_feedback)")

    def __post_init__(self):
        if not isinstance(self.error_feedback, bool):
            raise ValueError(f"error_feedback must be True or False; got {self.error_feedback!r}")
        check_range("momentum", self.momentum, 0.0, None)
        if self.momentum >= 1:
            raise ValueError(f"momentum must be in [0, 1); got {self.momentum!r}")
        if self.momentum > 0 and not self.error_feedback:
            # DGC's correction is a rule for accumulating the residual; with no residual the
            # velocity would silently become one (u keeps every unsent gradient).
            raise ValueError("momentum > 0 needs error_feedback=True")


@dataclass(frozen=True)
class CompressStats:
    """The last compress call (step, size, sent, threshold) and totals since reset."""

    step: int = 0
    size: int = 0
    sent: int = 0
    threshold: float = 0.0
    restarted: bool = False
    total_sent: int = 0
    total_size: int = 0

    @property
    def fraction(self) -> float:
        return self.sent / self.size if self.size else 0.0

    @property
    def total_fraction(self) -> float:
        return self.total_sent / self.total_size if self.total_size else 0.0


class Selection(NamedTuple):
    keys: torch.Tensor        # sorted int64 positions
    threshold: float          # the magnitude cut that produced them
    restarted: bool = False   # dynamic: the carried threshold kept too few


def host_values(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy: shared on the cpu, copied off a device (what the push
    sends then crosses: the selected entries, not the whole gradient)."""
    return (t if t.device.type == "cpu" else t.cpu()).numpy()


def as_flat(grad) -> torch.Tensor:
    """A 1-D float32/float64 tensor view of `grad` (a torch tensor or numpy array)."""
    g = torch.as_tensor(grad).detach()
    if g.dim() != 1 or g.dtype not in FLOAT_DTYPES:
        raise ValueError(f"grad must be a 1-D float32 or float64 tensor; got {g.dim()}-D "
                         f"{g.dtype}")
    return g


class Compressor(Configurable):
    """compress(grad) -> Sparse. Subclasses choose what to send in `_select`.

    `codec` (optional, a value codec such as make_codec("bf16")) encodes the selected values;
    the Sparse then carries the payload and its decoded values, and with error feedback the
    codec's error at the sent positions stays in the residual: after any number of steps,
    the sum of the decoded values sent plus the residual is the sum of the gradients."""

    name: ClassVar[str] = ""
    Options: ClassVar[type] = FeedbackOptions

    def __init__(self, codec: Codec | None = None, **options):
        if codec is not None and not isinstance(codec, Codec):
            raise ValueError(f"codec must be a Codec (make_codec(name)); got {codec!r}")
        self.codec = codec
        check_known(f"compressor {self.name!r}", options, describe(self.Options))
        self.opts = self.Options(**options)
        self.feedback = make_feedback(self.opts.error_feedback, self.opts.momentum)
        self.reset()

    def reset(self) -> None:
        """Forget the residual, velocity, carried threshold, the codec's state and stats."""
        self.feedback.reset()
        if self.codec is not None:
            self.codec.reset()
        self._size, self._dtype, self._mag = None, None, None
        self.stats = CompressStats()

    def options(self) -> dict:
        return asdict(self.opts)

    def compress(self, grad) -> Sparse:
        g = self._check(as_flat(grad))
        cand = self.feedback.add(g)
        mag = torch.abs(cand, out=self._mag)  # reused buffer: fresh pages cost ~a pass
        sel = self._select(cand, mag)
        values = cand[sel.keys]  # a gather: a copy, safe from the residual reset below
        encoded = None
        if self.codec is None:
            self.feedback.sent(sel.keys)
        else:
            values, encoded = self._encode_values(sel.keys, values)
        self._record(g.numel(), sel.keys.numel(), sel.threshold, sel.restarted)
        return Sparse(host_values(sel.keys), host_values(values), g.numel(), encoded)

    def kept(self, keys, extra) -> None:
        """What the wire delivered short of the values compress() returned (`extra` = those
        values - what the shards add, at `keys`; a block codec re-encoded per shard's slice
        rounds again) goes back into the residual, so sent + residual still sums every
        gradient. No-op without error feedback."""
        r = self.feedback.residual
        device = None if r is None else r.device
        self.feedback.kept(torch.as_tensor(keys, device=device),
                           torch.as_tensor(extra, device=device))

    def _encode_values(self, keys: torch.Tensor, values: torch.Tensor):
        """(decoded values, payload); what decoding lost goes back to the residual. A codec
        that refuses the values (NaN, inf) leaves them in the residual: reset() clears it."""
        encoded, sent = self.codec.encode_decoded(values)  # on values' device
        self.feedback.sent(keys, values.sub_(sent))
        return sent, encoded

    def _select(self, cand: torch.Tensor, mag: torch.Tensor) -> Selection:
        raise NotImplementedError

    def _check(self, g: torch.Tensor) -> torch.Tensor:
        if self._size is None:
            if self.codec is not None and g.dtype != torch.float32:
                raise ValueError(f"codec {self.codec.name!r} takes float32 gradients; got "
                                 f"{g.dtype}")
            self._size, self._dtype = g.numel(), g.dtype
            self._mag = torch.empty_like(g)
        elif (g.numel(), g.dtype) != (self._size, self._dtype):
            raise ValueError(f"grad changed from {self._size} x {self._dtype} to {g.numel()} x "
                             f"{g.dtype}; call reset() first")
        return g

    def _record(self, size: int, sent: int, threshold: float, restarted: bool = False) -> None:
        s = self.stats
        self.stats = CompressStats(s.step + 1, size, sent, float(threshold), restarted,
                                   s.total_sent + sent, s.total_size + size)

    @property
    def residual(self) -> torch.Tensor:
        """The unsent accumulation (live; do not modify). Zeros without error feedback."""
        r = self.feedback.residual
        if r is None:
            return torch.zeros(self._size or 0, dtype=self._dtype or torch.float32)
        return r

    @property
    def state(self) -> dict:
        """residual, velocity (DGC momentum; None when off) and any carried threshold."""
        return {"residual": self.residual, "velocity": self.feedback.velocity}
