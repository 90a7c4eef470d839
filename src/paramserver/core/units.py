"""Durations, sizes and rates as users type them (2ms, 45MB, 10Gbit/s): the one grammar.

Every flag that takes a quantity parses it here, so `--link 10Gbit/s`, `simulate --bandwidth
10Gbit/s` and `--device-time 2ms` read the same words the same way:

    DURATION  NUMBER{s,ms,us,µs,ns}; a bare 0 is zero (parse_seconds also takes a bare NUMBER
              as seconds, for flags that always took plain seconds)
    SIZE      NUMBER[b,kb,mb,gb,tb,kib,mib,gib]: bytes, decimal unless KiB/MiB/GiB
    RATE      NUMBER{bit,kbit,mbit,gbit,tbit} (bits) or NUMBER{b,kb,mb,gb,...} (bytes), then an
              optional /s; or the network-gear shorthand NUMBER{bps,kbps,Mbps,Gbps,Tbps} (bits)
              and NUMBER{Bps,kBps,MBps,GBps,TBps} (bytes); inf, infinite, unlimited, none: no limit
Units are case-insensitive (10MB is ten megabytes, 10Mbit ten megabits, 10gbps ten gigabits)
except for the one letter that tells bits from bytes in the `ps` shorthand: b is bits, B
bytes (10Gbps, 10gbps: gigabits; 10GBps: gigabytes).
"""

from __future__ import annotations

import math
import re

_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_BYTES = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2.0 ** 10, "mib": 2.0 ** 20, "gib": 2.0 ** 30}
# Bits per second per unit: a bit unit is scaled once (100mbit is exactly 1e8), a byte unit x8.
_BITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_DURATION = re.compile(rf"^{_NUMBER}\s*(s|ms|us|µs|ns)$")
_SIZE = re.compile(rf"^{_NUMBER}\s*([a-zA-Z]*)$")
_RATE = re.compile(rf"^{_NUMBER}\s*([a-zA-Z]*)\s*(?:/\s*s)?$")
_PS = re.compile(rf"^{_NUMBER}\s*([kKmMgGtT]?)(b|B)(?:ps|PS|Ps)$")
_PS_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
UNLIMITED = ("inf", "infinite", "unlimited", "none")

DURATION_EXAMPLES = "e.g. 2ms, 250us, 0.1s"
SIZE_EXAMPLES = "e.g. 4MB, 100KiB, 2GB"
RATE_EXAMPLES = "e.g. 10Gbit/s, 100mbit, 1.25GB/s, 800Mbps, unlimited"


class UnitError(ValueError):
    """A quantity that does not follow its grammar; the message shows accepted examples."""


def parse_duration(text: str, what: str = "duration", allow_zero: bool = True) -> float:
    """'2ms' -> 0.002 seconds; a bare 0 is accepted as zero."""
    raw = str(text).strip()
    if raw == "0" and allow_zero:
        return 0.0
    m = _DURATION.match(raw)
    value = float(m[1]) * _TIME[m[2]] if m else math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "" if allow_zero else " > 0"
        raise UnitError(f"bad {what} {text!r}: expected a time{bound} with a unit, "
                        f"{DURATION_EXAMPLES}")
    return value


def parse_seconds(text: str, what: str = "duration", allow_zero: bool = True) -> float:
    """A duration where a bare number means seconds ('30' -> 30.0, '500ms' -> 0.5)."""
    raw = str(text).strip()
    try:
        value = float(raw)
    except ValueError:
        return parse_duration(raw, what, allow_zero)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise UnitError(f"bad {what} {text!r}: expected seconds {bound} or a time with a unit, "
                        f"{DURATION_EXAMPLES}")
    return value


def parse_size(text: str, what: str = "size") -> float:
    """'45MB' -> 45e6 bytes; a bare number is bytes; KiB/MiB/GiB are binary."""
    m = _SIZE.match(str(text).strip())
    unit = (m[2] or "b").lower() if m else ""
    if not m or unit not in _BYTES:
        raise UnitError(f"bad {what} {text!r}: expected bytes with a unit, {SIZE_EXAMPLES}")
    return float(m[1]) * _BYTES[unit]


_COUNT = re.compile(rf"^{_NUMBER}\s*([kKmMgGbBtT]?)$")
_COUNT_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}
COUNT_EXAMPLES = "e.g. 1e9, 500M, 2.5G, 100k"


def parse_count(text: str, what: str = "count") -> int:
    """'500M' -> 500_000_000, '1e9' -> 10**9, '100k' -> 100_000 (decimal; B and G both 1e9):
    a count of things such as parameters, not bytes."""
    m = _COUNT.match(str(text).strip())
    value = float(m[1]) * _COUNT_UNITS[m[2].lower()] if m else math.nan
    if not math.isfinite(value) or value < 1:
        raise UnitError(f"bad {what} {text!r}: expected a count >= 1, {COUNT_EXAMPLES}")
    return int(round(value))


def parse_bitrate(text: str, what: str = "rate") -> float:
    """Bits per second from '10Gbit/s', '100mbit', '1.25GB/s', '800Mbps'; unlimited -> inf."""
    raw = str(text).strip().lower()
    if raw in UNLIMITED:
        return math.inf
    ps = _PS.match(str(text).strip())
    m = None if ps or raw.endswith("ps") else _RATE.match(raw)
    unit = (m[2] or "b") if m else ""
    value = math.nan
    if ps:
        value = float(ps[1]) * _PS_PREFIX[ps[2].lower()] * (1.0 if ps[3] == "b" else 8.0)
    elif m and unit in _BITS:
        value = float(m[1]) * _BITS[unit]
    elif m and unit in _BYTES:
        value = float(m[1]) * _BYTES[unit] * 8.0
    if not math.isfinite(value) or value <= 0:
        raise UnitError(f"bad {what} {text!r}: expected a rate > 0, {RATE_EXAMPLES}")
    return value


def parse_bandwidth(text: str, what: str = "bandwidth") -> float:
    """Bytes per second, in the RATE grammar ('10Gbit/s' -> 1.25e9); 'inf' means no limit."""
    return parse_bitrate(text, what) / 8.0


def format_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}B"
