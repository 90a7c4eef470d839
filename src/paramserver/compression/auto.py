"""`--compress auto` (issue 22): the push format of each tensor and each worker, from the
tensor's size and the worker's link rate (its own link, or its share of the servers' links
where those are slower: `link_rate`). A table lookup; no I/O.

    worker's link rate              tensors of >= dense_below values    smaller tensors
    >= dense_at (10 Gbit/s), unset  none (float32)                      none
    >= bf16_at (1 Gbit/s)           bf16                                none
    slower                          slow: uniform8 (default), or        none
                                    topk+bf16 (top-k at `fraction`,
                                    its values as bf16)

A fast link gains little from fewer bytes and pays the codec's error and encoding time; a
slow one is bound by bytes, so it compresses harder (BytePS's result: several-fold on a slow
link, little on a fast one). Small tensors (biases, norms) cost few bytes and their values
matter most per byte, so they stay dense. The rate is the worker's emulated link (`--link`,
emulation/links.py), capped by its share of the shards' links (`--link s=...`); a worker
with neither is taken as fast.

Inside one push the choice is per tensor: a worker whose large tensors go through a codec
(bf16, uniform8) pushes with codec `mixed` (compression/mixed.py), which sends the small
tensors' runs as float32 and the rest through that codec (`AutoPlan.worker`; `AutoPlan.tensors`
lists each tensor's choice). Top-k (slow=topk) picks keys by magnitude over the whole vector,
small tensors included, so its plan pushes every value in one format (error feedback keeps
what is not sent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Mapping, Sequence

from paramserver.core.options import check_choice, check_int, check_known, check_range, opt
from paramserver.core.units import UnitError, parse_bitrate

SLOW = ("uniform8", "topk")
TIERS = ("dense", "bf16", "slow")


def _bits_per_s(name: str, value) -> float:
    """A rate option: bits/s as a number, or a text with its unit (10gbit, 1Gbit/s)."""
    if isinstance(value, str):
        try:
            value = parse_bitrate(value, name)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a rate (bits/s, or with a unit: 1gbit); got {value!r}")
    check_range(name, float(value), 0.0, lo_open=True)
    return float(value)


@dataclass(frozen=True)
class AutoOptions:
    """The thresholds of the table above (`--compress-opt KEY=VALUE`)."""

    dense_below: int = opt(4096, "tensors with fewer values than this stay dense float32")
    dense_at: float = opt(10e9, "a link at least this fast pushes dense (bits/s, or with a "
                                "unit: 10gbit)")
    bf16_at: float = opt(1e9, "a link at least this fast (below dense_at) pushes bf16; a "
                              "slower one uses `slow`")
    slow: str = opt("uniform8", "below bf16_at: uniform8 (8 bits a value, a scale per block) "
                                "or topk (top-k with bf16 values)")
    fraction: float = opt(0.01, "with slow=topk: the share of values each push sends")

    def __post_init__(self):
        check_int("dense_below", self.dense_below, 0)
        for name in ("dense_at", "bf16_at"):
            object.__setattr__(self, name, _bits_per_s(name, getattr(self, name)))
        if self.bf16_at > self.dense_at:
            raise ValueError(f"bf16_at ({self.bf16_at:g} bit/s) must not exceed dense_at "
                             f"({self.dense_at:g} bit/s)")
        check_choice("slow", self.slow, SLOW)
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)):
            raise ValueError(f"fraction must be a number; got {self.fraction!r}")
        check_range("fraction", self.fraction, 0.0, 1.0, lo_open=True)

    @classmethod
    def parse(cls, options: Mapping) -> "AutoOptions":
        """`--compress-opt` values; an unknown name lists the known ones (ValueError)."""
        check_known("--compress auto", options, [f.name for f in fields(cls)])
        return cls(**options)


@dataclass(frozen=True)
class Choice:
    """A push format as `--compress NAME --compress-opt K=V ...` would name it."""

    compress: str
    options: tuple[tuple[str, object], ...] = ()

    def label(self) -> str:
        """As step records' push_codec says it: none, bf16, uniform8, topk+bf16."""
        opts = dict(self.options)
        if self.compress == "mixed":
            return f"{opts['inner']}+small-fp32"
        codec = opts.get("codec")
        return self.compress if codec is None else f"{self.compress}+{codec}"


DENSE = Choice("none")
BF16 = Choice("bf16")


@dataclass(frozen=True)
class AutoPlan:
    """One worker's choice: per tensor (in key order), and the one its pushes use."""

    rate: float | None  # bits/s; None: no emulated link (fast)
    tier: str  # one of TIERS
    tensors: tuple[Choice, ...]
    worker: Choice


def link_rate(own: float | None, servers: Sequence[float | None], workers: int
              ) -> float | None:
    """The rate (bits/s) a worker's push or pull moves at: its own link's, or its share of the
    servers' links where --link shapes those (None: not shaped). Every worker sends each of
    the S shards its slice at about the same time (a round), so a shard's link gives each
    worker rate / workers, and a push ends when its slice to the slowest shaped shard is
    through: S x min(rate) / workers for the whole vector (equal slices). Pessimistic where
    workers do not push together (asp); None when nothing is shaped."""
    shaped = [r for r in servers if r is not None]
    if not shaped:
        return own
    share = len(servers) * min(shaped) / max(1, workers)
    return share if own is None else min(own, share)


def tier(rate: float | None, o: AutoOptions) -> str:
    """dense, bf16 or slow for a link of `rate` bits/s (None or inf: unshaped, fast)."""
    if rate is None or rate >= o.dense_at:
        return "dense"
    return "bf16" if rate >= o.bf16_at else "slow"


def tier_choice(name: str, o: AutoOptions) -> Choice:
    """What a large tensor pushes at a tier."""
    if name == "dense":
        return DENSE
    if name == "bf16":
        return BF16
    if o.slow == "topk":
        return Choice("topk", (("fraction", o.fraction), ("codec", "bf16")))
    return Choice(o.slow)


def choose_tensor(size: int, rate: float | None, o: AutoOptions) -> Choice:
    """One tensor of `size` values on a link of `rate` bits/s."""
    return DENSE if size < o.dense_below else tier_choice(tier(rate, o), o)


def plan(sizes: Sequence[int], rate: float | None, o: AutoOptions) -> AutoPlan:
    """A worker's plan for its tensors' sizes (values each) behind a link of `rate` bits/s."""
    t = tier(rate, o)
    tensors = tuple(choose_tensor(n, rate, o) for n in sizes)
    worker = tier_choice(t, o) if any(n >= o.dense_below for n in sizes) else DENSE
    if worker.compress in ("bf16", "uniform8") and any(c == DENSE for c in tensors):
        worker = Choice("mixed", (("inner", worker.compress), ("dense_below", o.dense_below)))
    return AutoPlan(rate, t, tensors, worker)
