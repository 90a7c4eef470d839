"""Durations, sizes and bandwidths as users type them (2ms, 45MB, 10Gbit/s), parsed to SI floats."""

from __future__ import annotations

import math
import re

_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_BYTES = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2.0 ** 10, "mib": 2.0 ** 20, "gib": 2.0 ** 30}
_BITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_DURATION = re.compile(rf"^{_NUMBER}\s*(s|ms|us|µs|ns)$")
_SIZE = re.compile(rf"^{_NUMBER}\s*([a-zA-Z]*)$")
_RATE = re.compile(rf"^{_NUMBER}\s*([a-zA-Z]*)\s*(?:/\s*s|ps)?$")


class UnitError(ValueError):
    """A quantity that does not follow its grammar; the message shows accepted examples."""


def parse_duration(text: str, what: str = "duration", allow_zero: bool = True) -> float:
    """'2ms' -> 0.002; a bare 0 is accepted as zero."""
    raw = str(text).strip()
    if raw == "0" and allow_zero:
        return 0.0
    m = _DURATION.match(raw)
    value = float(m[1]) * _TIME[m[2]] if m else math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise UnitError(f"bad {what} {text!r}: expected a time with a unit, e.g. 2ms, 250us, 0.1s")
    return value


def parse_size(text: str, what: str = "size") -> float:
    """'45MB' -> 45e6 bytes; a bare number is bytes; KiB/MiB/GiB are binary."""
    m = _SIZE.match(str(text).strip())
    unit = (m[2] or "b").lower() if m else ""
    if not m or unit not in _BYTES:
        raise UnitError(f"bad {what} {text!r}: expected bytes with a unit, e.g. 4MB, 100KiB, 2GB")
    return float(m[1]) * _BYTES[unit]


def parse_bandwidth(text: str) -> float:
    """Bytes per second from '10Gbit/s', '1.25GB/s', '800Mbps'; 'inf' means no transfer time."""
    raw = str(text).strip().lower()
    if raw in ("inf", "infinite", "none"):
        return math.inf
    m = _RATE.match(raw.replace("bps", "bit/s"))
    unit = (m[2] or "b").lower() if m else ""
    scale = _BYTES.get(unit) or _BITS.get(unit)
    value = float(m[1]) * scale if m and scale else math.nan
    if not math.isfinite(value) or value <= 0:
        raise UnitError(f"bad bandwidth {text!r}: expected e.g. 10Gbit/s, 1.25GB/s, 800Mbps, inf")
    return value


def format_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}B"
