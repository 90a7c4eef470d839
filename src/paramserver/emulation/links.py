"""Emulated network links: the `--link` grammar and a token bucket driven by an injected clock.

A link is a rate (bits per second, each direction on its own, as a full-duplex NIC) and a
one-way latency. Grammar of one `--link` value (several entries may be joined with `;`, and
`--link` may be repeated; a rank's own entry beats its role's default):

    [TARGET=]RATE[,LATENCY] | [TARGET=]LATENCY
    TARGET   w | w* | wN (worker of rank N) | s | s* | sN (server N); none means every worker
    RATE     a rate with its unit in the shared grammar of paramserver.core.units (100mbit,
             10Gbit/s, 1.25GB/s, 800Mbps), or unlimited
    LATENCY  a duration with its unit (250us, 5ms, 1s)

Examples: `100mbit` (every worker), `w2=10mbit,5ms`, `s0=1gbit;w=100mbit`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from paramserver.core.units import UnitError, parse_bitrate, parse_duration

_TARGET = re.compile(r"([ws])(\*|\d+)?$")
HELP = """  An emulated link per host, applied in the transport (token bucket): each message a shaped
  process sends or receives waits for its bytes at RATE (each direction on its own) plus the
  one-way LATENCY. TARGET: w (every worker, the default), wN (worker of rank N), s (every
  server), sN (the N-th server started). RATE: a number with a unit, as --bandwidth of
  simulate reads it (100mbit, 10Gbit/s, 1.25GB/s, 800Mbps) or unlimited; LATENCY: a number
  with a unit (250us, 5ms, 1s). Entries may be joined with ';'. A rank's own entry beats its
  role's. Examples: --link 100mbit, --link 'w=100mbit;w2=10mbit,5ms', --link s0=1gbit."""
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


def _rate(part: str) -> float | None:
    """Bits/s of a link part, math.inf for unlimited; None when the part is not a rate."""
    if part.replace(".", "", 1).isdigit():
        return None  # a bare number could be a rate or a latency: a link part needs its unit
    try:
        return parse_bitrate(part, "link rate")
    except UnitError:
        return None


def parse_link(text: str) -> LinkSpec:
    """`RATE[,LATENCY]` or `LATENCY` into a LinkSpec; a clear ValueError otherwise."""
    rate, latency, seen_rate = None, 0.0, False
    parts = [p.strip() for p in text.split(",")]
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise UnitError(f"link {text!r} is not RATE[,LATENCY] (e.g. 100mbit,5ms)")
    for part in parts:
        value = _rate(part)
        if value is not None and not seen_rate:
            rate, seen_rate = (None if math.isinf(value) else value), True
            continue
        try:
            if value is None and not latency:
                latency = parse_duration(part, "link latency")
                continue
        except UnitError:
            pass
        raise UnitError(f"cannot read {part!r} in link {text!r}: a rate is a number with a "
                        f"unit (100mbit, 10Gbit/s, 1.25GB/s) or unlimited, a latency a number "
                        f"with a unit (250us, 5ms)")
    return LinkSpec(rate, latency)


@dataclass(frozen=True)
class LinkEntry:
    """One `--link` entry: `role` "w" or "s", `target` "*" or a rank, its text and its link."""

    role: str
    target: str
    text: str
    spec: LinkSpec

    def arg(self) -> str:
        """The entry as a --link value reads it back."""
        return f"{self.role}{self.target}={self.text}"


@dataclass(frozen=True)
class LinkTable:
    """Every host's emulated link, parsed once; later entries for a target replace earlier."""

    entries: tuple[LinkEntry, ...] = ()

    @classmethod
    def parse(cls, values: "list[str] | str | None") -> "LinkTable":
        """`--link` values (each may join entries with ';') into a table."""
        values = [values] if isinstance(values, str) else values or []
        entries = []
        for value in values:
            for entry in filter(None, (e.strip() for e in value.split(";"))):
                target, sep, link = entry.partition("=")
                if not sep:
                    target, link = "w", entry
                m = _TARGET.match(target.strip().lower())
                if not m:
                    raise UnitError(f"link target {target!r} is not w, w*, wN, s, s* or sN")
                rank = m.group(2) if m.group(2) not in (None, "*") else "*"
                entries.append(LinkEntry(m.group(1), rank, link.strip(), parse_link(link)))
        return cls(()).merged(cls(tuple(entries)))

    @classmethod
    def from_dict(cls, table: dict | None) -> "LinkTable":
        """The JSON table of to_dict (a job file) back into a LinkTable."""
        entries = []
        for role, targets in (table or {}).items():
            if role not in ("w", "s") or not isinstance(targets, dict):
                raise UnitError(f"links: {role!r} is not w or s with a table of targets")
            for target, text in targets.items():
                if not (target == "*" or str(target).isdigit()):
                    raise UnitError(f"links: target {role}{target} is not {role}* or {role}N")
                entries.append(LinkEntry(role, str(target), str(text), parse_link(str(text))))
        return cls(tuple(entries))

    def merged(self, other: "LinkTable") -> "LinkTable":
        table = {(e.role, e.target): e for e in (*self.entries, *other.entries)}
        return LinkTable(tuple(table.values()))

    def to_dict(self) -> dict:
        """JSON-able {"w": {"*"|"N": text}, "s": {...}}, or {} with no entries."""
        out: dict = {"w": {}, "s": {}}
        for e in self.entries:
            out[e.role][e.target] = e.text
        return out if self.entries else {}

    def args(self) -> list[str]:
        return [e.arg() for e in self.entries]

    def link_for(self, role: str, rank: int) -> LinkSpec | None:
        """The link of `role` ("w" or "s") rank `rank`; None: not shaped."""
        own = any_ = None
        for e in self.entries:
            if e.role == role and e.target == str(rank):
                own = e.spec
            elif e.role == role and e.target == "*":
                any_ = e.spec
        return own or any_

    def check_ranks(self, workers: int, servers: int | None) -> None:
        """Fail on an entry that names a worker or server the job does not have (its link
        would shape nothing, silently). `servers` None: not known yet, not checked."""
        counts = {"w": ("worker", workers), "s": ("server", servers)}
        for e in self.entries:
            kind, n = counts[e.role]
            if e.target != "*" and n is not None and int(e.target) >= n:
                raise UnitError(f"--link {e.arg()!r} names {kind} {e.target} but the job has "
                                f"{kind}s 0..{n - 1} ({e.role}0..{e.role}{n - 1})")

    def __bool__(self) -> bool:
        return bool(self.entries)


def parse_links(values: list[str] | None) -> dict:
    """`--link` values into a JSON-able table {"w": {"*"|"N": text}, "s": {...}}."""
    return LinkTable.parse(values).to_dict()


def link_for(table: "dict | LinkTable | None", role: str, rank: int) -> LinkSpec | None:
    """The link of `role` ("w" or "s") rank `rank` in a table; None: not shaped."""
    if isinstance(table, LinkTable):
        return table.link_for(role, rank)
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
