"""Preflight link probes: before the start barrier each worker measures its link to each shard.

Pure: the worker's client (client/preflight.py) does the I/O and hands `probe_link` a `roundtrip(n)`
that asks one shard for `n` bytes (the server op `probe`, a uint8 frame of zeros) and returns
the seconds it took; the coordinator's core keeps the figures in a `PreflightBook`, whose
document its node writes to RUN/preflight.json (schema in docs/metrics.md).

How a link is measured, per shard, one shard after another (the worker's link is one, shared
by all its shards):
- the round trip: PINGS requests of 0 bytes; the median is `rtt_ms`;
- the rate: a first burst of FIRST_BYTES sizes the second, which should take about TARGET_S
  at the first's rate, within MIN_BYTES..MAX_BYTES; its time less one round trip gives
  `mbit_s` (the bytes come from the shard: the pull direction), and `bytes` is its size.
A slow link thus costs about TARGET_S plus its round trips per shard, a fast one a few ms.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

PINGS = 3
FIRST_BYTES = 64 << 10
MIN_BYTES = 256 << 10
MAX_BYTES = 2 << 20  # (4 MB cost twice the startup on loopback and read no better)
TARGET_S = 0.25
# What a server sends for one probe at most: a bigger ask is answered with this many bytes.
SERVE_MAX = 4 << 20
# Links one worker may report (a shard count far above any job's).
MAX_LINKS = 4096
FILE_VERSION = 1


@dataclass(frozen=True)
class LinkProbe:
    """One worker's link to one shard: the median round trip (s), the burst's rate (bits/s)
    and its size (bytes)."""

    shard: int
    rtt_s: float
    rate: float
    nbytes: int

    def wire(self) -> list:
        """[shard, rtt_ms, mbit_s, bytes]: the `preflight` message's entry."""
        return [self.shard, round(self.rtt_s * 1e3, 4), round(self.rate / 1e6, 3), self.nbytes]


def burst_size(first_bytes: int, first_s: float, rtt_s: float, target_s: float = TARGET_S,
               lo: int = MIN_BYTES, hi: int = MAX_BYTES) -> int:
    """The second burst's bytes: what the first's rate carries in `target_s`, in lo..hi."""
    return int(min(hi, max(lo, first_bytes / _carried(first_s, rtt_s) * target_s)))


def rate_of(nbytes: int, seconds: float, rtt_s: float) -> float:
    """Bits per second of a burst of `nbytes` that took `seconds` on a link of round trip
    `rtt_s` (the burst's own round trip taken off where the burst is clearly longer)."""
    return nbytes * 8 / _carried(seconds, rtt_s)


def _carried(seconds: float, rtt_s: float) -> float:
    """The burst's time on the wire. The round trip is a median of three pings taken before
    it: on a busy host one ping can take longer than the whole burst, and taking it off would
    leave ~0 s and an absurd rate (2 MB "in 1 us", 16 Tbit/s). Only a burst at least twice the
    round trip has it taken off; a shorter one keeps its whole time, a rate that errs low."""
    carried = seconds - rtt_s if seconds >= 2 * rtt_s else seconds
    return max(carried, 1e-6)


def probe_link(shard: int, roundtrip: Callable[[int], float], pings: int = PINGS,
               first_bytes: int = FIRST_BYTES, target_s: float = TARGET_S,
               lo: int = MIN_BYTES, hi: int = MAX_BYTES) -> LinkProbe:
    """Measure one link through `roundtrip(nbytes) -> seconds`."""
    rtt = statistics.median(roundtrip(0) for _ in range(max(1, pings)))
    first = roundtrip(first_bytes)
    n = burst_size(first_bytes, first, rtt, target_s, lo, hi)
    return LinkProbe(shard, rtt, rate_of(n, roundtrip(n), rtt), n)


def served_bytes(asked: int, limit: int) -> int:
    """What a server sends for a probe asking `asked` bytes: at most SERVE_MAX and `limit`."""
    return max(0, min(int(asked), SERVE_MAX, int(limit)))


def parse_links(entries) -> list[dict]:
    """The `preflight` message's links ([shard, rtt_ms, mbit_s, bytes] each) as preflight.json
    entries without the worker; a ValueError naming the fault otherwise."""
    if not isinstance(entries, (list, tuple)) or len(entries) > MAX_LINKS:
        raise ValueError(f"preflight links must be a list of at most {MAX_LINKS} entries")
    out = []
    for e in entries:
        ok = isinstance(e, (list, tuple)) and len(e) == 4 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in e) \
            and isinstance(e[0], int) and isinstance(e[3], int)
        if not ok:
            raise ValueError(f"preflight link {e!r} is not [shard, rtt_ms, mbit_s, bytes] of "
                             f"non-negative numbers")
        out.append({"shard": e[0], "rtt_ms": float(e[1]), "mbit_s": float(e[2]),
                    "bytes": e[3]})
    return out


class PreflightBook:
    """The coordinator's figures: each worker's links as reported (a later report of the same
    worker replaces its links). `expected` workers complete the first round of reports."""

    def __init__(self, expected: int):
        self.expected = expected
        self.links: dict[str, list[dict]] = {}
        self.announced: set[str] = set()

    def report(self, worker: str, links: list[dict]) -> list[str]:
        """Record `worker`'s links; the workers to announce now (in events.jsonl): none until
        `expected` have reported, then all of them at once, then each newcomer alone."""
        self.links[worker] = links
        if len(self.links) < self.expected:
            return []
        due = [w for w in self.links if w not in self.announced]
        self.announced.update(due)
        return due

    def entries(self, workers=None) -> list[dict]:
        names = self.links if workers is None else workers
        return [{"worker": w, **link} for w in names for link in self.links[w]]

    def document(self, t: float) -> dict:
        """preflight.json: every link reported so far; `t` seconds since the coordinator
        started."""
        return {"version": FILE_VERSION, "links": self.entries(), "t": round(t, 6)}
