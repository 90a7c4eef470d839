"""Emulated network links: the `--link` grammar and a token bucket driven by an injected clock.

A link is a rate (bits per second, each direction on its own, as a full-duplex NIC) and a
one-way latency. Grammar of one `--link` value (several entries may be joined with `;`, and
`--link` may be repeated; a rank's own entry beats its role's default):

    [TARGET=]RATE[,LATENCY] | [TARGET=]LATENCY
    TARGET   w | w* | wN (worker of rank N) | s | s* | sN (server N); none means every worker
    RATE     NUMBER followed by bit, kbit, mbit or gbit (decimal, per second), or `unlimited`
    LATENCY  NUMBER followed by us, ms or s

Examples: `100mbit` (every worker), `w2=10mbit,5ms`, `s0=1gbit;w=100mbit`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_RATE = re.compile(_NUMBER + r"(bit|kbit|mbit|gbit)$")
_TIME = re.compile(_NUMBER + r"(us|ms|s)$")
_TARGET = re.compile(r"([ws])(\*|\d+)?$")
HELP = """  An emulated link per host, applied in the transport (token bucket): each message a shaped
  process sends or receives waits for its bytes at RATE (each direction on its own) plus the
  one-way LATENCY. TARGET: w (every worker, the default), wN (worker of rank N), s (every
  server), sN (the N-th server started). RATE: NUMBER{bit,kbit,mbit,gbit} per second or
  unlimited; LATENCY: NUMBER{us,ms,s}. Entries may be joined with ';'. A rank's own entry
  beats its role's. Examples: --link 100mbit, --link 'w=100mbit;w2=10mbit,5ms', --link s0=1gbit."""
MIN_BURST = 16384  # bytes a link lets through at once after being idle


@dataclass(frozen=True)
class LinkSpec:
    """One host's link: `rate` in bits/s (None: unlimited) and one-way `latency` in seconds."""

    rate: float | None = None
    latency: float = 0.0

    @property
    def bytes_per_s(self) -> float | None:
        return None if self.rate is None else self.rate / 8.0

    def text(self) -> str:
        rate = "unlimited" if self.rate is None else f"{self.rate / 1e6:g}mbit"
        return rate if not self.latency else f"{rate},{self.latency * 1e3:g}ms"


def parse_link(text: str) -> LinkSpec:
    """`RATE[,LATENCY]` or `LATENCY` into a LinkSpec; a clear ValueError otherwise."""
    rate, latency = None, 0.0
    parts = [p.strip().lower() for p in text.split(",")]
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ValueError(f"link {text!r} is not RATE[,LATENCY] (e.g. 100mbit,5ms)")
    for part in parts:
        if (m := _RATE.match(part)) and rate is None:
            rate = float(m.group(1)) * RATE_UNITS[m.group(2)]
            if rate <= 0:
                raise ValueError(f"link rate {part!r} must be positive")
        elif part == "unlimited" and rate is None:
            continue
        elif (m := _TIME.match(part)) and not latency:
            latency = float(m.group(1)) * TIME_UNITS[m.group(2)]
        else:
            raise ValueError(f"cannot read {part!r} in link {text!r}: a rate is NUMBER"
                             f"{{bit,kbit,mbit,gbit}} or unlimited, a latency NUMBER{{us,ms,s}}")
    return LinkSpec(rate, latency)


def parse_links(values: list[str] | None) -> dict:
    """`--link` values into a JSON-able table {"w": {"*"|"N": text}, "s": {...}}."""
    table: dict = {"w": {}, "s": {}}
    for value in values or []:
        for entry in filter(None, (e.strip() for e in value.split(";"))):
            target, sep, link = entry.partition("=")
            if not sep:
                target, link = "w", entry
            m = _TARGET.match(target.strip().lower())
            if not m:
                raise ValueError(f"link target {target!r} is not w, w*, wN, s, s* or sN")
            parse_link(link)  # fails early, naming the bad part
            table[m.group(1)][m.group(2) if m.group(2) not in (None, "*") else "*"] = link.strip()
    return table if table["w"] or table["s"] else {}


def link_for(table: dict | None, role: str, rank: int) -> LinkSpec | None:
    """The link of `role` ("w" or "s") rank `rank` in a parse_links table; None: not shaped."""
    entries = (table or {}).get(role, {})
    text = entries.get(str(rank), entries.get("*"))
    return None if text is None else parse_link(text)


class TokenBucket:
    """Bytes through a link of `rate` bytes/s that may burst `burst` bytes after idling.

    `reserve(n, now)` books n bytes and returns how long the caller waits before they are
    through. The bucket may go into debt: a message bigger than the burst waits for its
    bytes, and the next one also waits for the debt (one serial link)."""

    def __init__(self, rate: float, burst: float, now: float):
        if rate <= 0 or burst < 0:
            raise ValueError("a token bucket needs rate > 0 and burst >= 0")
        self.rate, self.burst = float(rate), float(burst)
        self.tokens, self.t = float(burst), float(now)

    def reserve(self, nbytes: int, now: float) -> float:
        if now > self.t:
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now
        self.tokens -= nbytes
        return max(0.0, -self.tokens / self.rate)


class Link:
    """A host's link: one bucket per direction plus the one-way latency on every message."""

    def __init__(self, spec: LinkSpec, now: float, burst: float | None = None):
        self.spec = spec
        rate = spec.bytes_per_s
        burst = max(MIN_BURST, rate * 0.002) if burst is None and rate else (burst or 0.0)
        self.up = TokenBucket(rate, burst, now) if rate else None
        self.down = TokenBucket(rate, burst, now) if rate else None

    def send_delay(self, nbytes: int, now: float) -> float:
        wait = self.up.reserve(nbytes, now) if self.up else 0.0
        return wait + self.spec.latency

    def recv_delay(self, nbytes: int, now: float) -> float:
        wait = self.down.reserve(nbytes, now) if self.down else 0.0
        return wait + self.spec.latency
