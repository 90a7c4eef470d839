"""Injected slowness (`--straggler`): per-worker factors on step time. Pure logic, no clock."""

from __future__ import annotations

import argparse
import bisect
import csv
import io
import math
import re
from collections.abc import Callable

from paramserver.core.units import UnitError, parse_seconds

STRAGGLER_HELP = """\
per-worker slowdown factors (workers are 0-based ranks; a factor scales a step's device time):
  none                      every worker at full speed (default)
  1:3,2:1.5                 worker 1 is 3x slower, worker 2 1.5x, the rest 1x
  random:0.1:4              each step, each worker is 4x slower with probability 0.1
  schedule:1:0-30=3,30-60=1.5;2:10-=2
                            worker 1 3x slower for 0<=t<30 s, 1.5x for 30<=t<60 s; worker 2 2x
                            from t=10 s on (an omitted end means forever); 1x outside intervals;
                            times are seconds or durations with a unit (90s, 1500ms)
  trace:FILE.csv            replay a CSV with header time_s,worker,factor: each worker's factor is
                            that of its latest row with time_s <= t (1x before its first row)
  A+B                       terms multiply, e.g. 1:3+random:0.05:2 (trace paths cannot contain +)"""

_MASK = (1 << 64) - 1


class StragglerSpecError(argparse.ArgumentTypeError, ValueError):
    """A --straggler or --device-time value that does not follow the grammar.

    An ArgumentTypeError so that argparse `type=parse_straggler` shows this message verbatim.
    """


# --- straggler models ---------------------------------------------------------------------------
class StragglerModel:
    """factor(worker, step, t) >= 0 scales worker `worker`'s step `step` that starts at t seconds."""

    spec = "none"

    def factor(self, worker: int, step: int, t: float) -> float:
        return 1.0

    def workers(self) -> set[int]:
        """Worker ranks the spec names explicitly (checked against the job size)."""
        return set()

    def check_workers(self, num_workers: int) -> None:
        """Fail if the spec names a worker rank that the job does not have."""
        extra = sorted(w for w in self.workers() if w >= num_workers)
        if extra:
            raise StragglerSpecError(f"--straggler {self.spec!r} names worker(s) {extra} but the "
                                     f"job has workers 0..{num_workers - 1}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class StaticStragglers(StragglerModel):
    """Fixed per-worker factors."""

    def __init__(self, factors: dict[int, float], spec: str = ""):
        self.factors, self.spec = dict(factors), spec

    def factor(self, worker: int, step: int, t: float) -> float:
        return self.factors.get(worker, 1.0)

    def workers(self) -> set[int]:
        return set(self.factors)


def _mix64(x: int) -> int:
    """splitmix64 finalizer: a stateless hash, so random slowdowns need no shared RNG state."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class RandomStragglers(StragglerModel):
    """Each (worker, step) is independently slowed by `slow` with probability `p`."""

    def __init__(self, p: float, slow: float, seed: int = 0, spec: str = ""):
        self.p, self.slow, self.seed, self.spec = p, slow, seed, spec

    def uniform(self, worker: int, step: int) -> float:
        """A deterministic uniform [0, 1) draw for (seed, worker, step)."""
        x = _mix64(_mix64(_mix64(self.seed & _MASK) ^ (worker & _MASK)) ^ (step & _MASK))
        return (x >> 11) / float(1 << 53)

    def factor(self, worker: int, step: int, t: float) -> float:
        return self.slow if self.uniform(worker, step) < self.p else 1.0


class StepFunctionStragglers(StragglerModel):
    """Per-worker piecewise-constant factors over time (schedules and replayed traces)."""

    def __init__(self, points: dict[int, list[tuple[float, float]]], spec: str = ""):
        # points[w] = sorted (start time, factor); a factor holds until the next start.
        self.spec = spec
        self._times = {w: [t for t, _ in pts] for w, pts in points.items()}
        self._factors = {w: [f for _, f in pts] for w, pts in points.items()}

    def factor(self, worker: int, step: int, t: float) -> float:
        times = self._times.get(worker)
        if not times:
            return 1.0
        i = bisect.bisect_right(times, t) - 1
        return self._factors[worker][i] if i >= 0 else 1.0

    def workers(self) -> set[int]:
        return set(self._times)


class ProductStragglers(StragglerModel):
    """Terms joined by '+': their factors multiply."""

    def __init__(self, terms: list[StragglerModel], spec: str = ""):
        self.terms, self.spec = terms, spec

    def factor(self, worker: int, step: int, t: float) -> float:
        return math.prod(term.factor(worker, step, t) for term in self.terms)

    def workers(self) -> set[int]:
        return set().union(*(term.workers() for term in self.terms))


# --- spec parsing -------------------------------------------------------------------------------
def _number(text: str, what: str, spec: str, positive: bool = True) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise StragglerSpecError(f"bad --straggler {spec!r}: {what} must be a number {bound}, "
                                 f"got {text!r}")
    return value


def _seconds(text: str, what: str, spec: str, positive: bool = True) -> float:
    """A time in seconds: a bare number, or a duration with its unit (core.units), e.g. 90s."""
    try:
        return parse_seconds(text, what, allow_zero=not positive)
    except UnitError:
        bound = "> 0" if positive else ">= 0"
        raise StragglerSpecError(f"bad --straggler {spec!r}: {what} must be a number {bound} "
                                 f"(seconds) or a time with a unit, got {text!r}") from None


def _worker(text: str, spec: str) -> int:
    if not text.strip().isdigit():
        raise StragglerSpecError(f"bad --straggler {spec!r}: worker must be a rank 0, 1, 2..., "
                                 f"got {text!r}")
    return int(text)


def _parse_static(term: str, spec: str) -> StragglerModel:
    factors = {}
    for item in term.split(","):
        worker, sep, value = item.partition(":")
        if not sep:
            raise StragglerSpecError(f"bad --straggler {spec!r}: expected WORKER:FACTOR pairs "
                                     f"like 1:3,2:1.5, got {item!r}")
        w = _worker(worker, spec)
        if w in factors:
            raise StragglerSpecError(f"bad --straggler {spec!r}: worker {w} given twice")
        factors[w] = _number(value, f"factor of worker {w}", spec)
    return StaticStragglers(factors, term)


def _parse_random(body: str, spec: str, seed: int) -> StragglerModel:
    parts = body.split(":")
    if len(parts) != 2:
        raise StragglerSpecError(f"bad --straggler {spec!r}: expected random:PROB:FACTOR, "
                                 f"e.g. random:0.1:4")
    p = _number(parts[0], "probability", spec, positive=False)
    if p > 1:
        raise StragglerSpecError(f"bad --straggler {spec!r}: probability must be in [0, 1]")
    return RandomStragglers(p, _number(parts[1], "factor", spec), seed, f"random:{body}")


_INTERVAL = re.compile(r"^\s*([^-=]+)-([^-=]*)=(.+)$")


def _parse_intervals(worker: int, body: str, spec: str) -> list[tuple[float, float]]:
    """'0-30=3,30-=1.5' -> [(0, 3), (30, 1.5)], with 1x filled into gaps; overlaps rejected."""
    spans = []
    for item in body.split(","):
        m = _INTERVAL.match(item)
        if not m:
            raise StragglerSpecError(f"bad --straggler {spec!r}: expected START-END=FACTOR "
                                     f"(seconds; END may be empty), got {item!r}")
        lo = _seconds(m[1], "interval start", spec, positive=False)
        hi = math.inf if m[2].strip() in ("", "inf") else _seconds(m[2], "interval end", spec)
        if hi <= lo:
            raise StragglerSpecError(f"bad --straggler {spec!r}: empty interval {item!r}")
        spans.append((lo, hi, _number(m[3], "factor", spec)))
    spans.sort()
    points: list[tuple[float, float]] = []
    for i, (lo, hi, f) in enumerate(spans):
        if i and lo < spans[i - 1][1]:
            raise StragglerSpecError(f"bad --straggler {spec!r}: intervals of worker {worker} "
                                     f"overlap at t={lo:g}")
        points.append((lo, f))
        if hi != math.inf and (i + 1 == len(spans) or spans[i + 1][0] > hi):
            points.append((hi, 1.0))
    return points


def _parse_schedule(body: str, spec: str) -> StragglerModel:
    points = {}
    for block in body.split(";"):
        worker, sep, intervals = block.partition(":")
        if not sep:
            raise StragglerSpecError(f"bad --straggler {spec!r}: expected schedule:WORKER:"
                                     f"START-END=FACTOR,...[;WORKER:...], got {block!r}")
        w = _worker(worker, spec)
        if w in points:
            raise StragglerSpecError(f"bad --straggler {spec!r}: worker {w} scheduled twice")
        points[w] = _parse_intervals(w, intervals, spec)
    return StepFunctionStragglers(points, f"schedule:{body}")


def parse_trace(text: str, source: str = "<trace>") -> StragglerModel:
    """A replayable model from CSV text with columns time_s,worker,factor (extra columns ignored)."""
    reader = csv.DictReader(io.StringIO(text))
    missing = {"time_s", "worker", "factor"} - set(reader.fieldnames or ())
    if missing:
        raise StragglerSpecError(f"{source}: CSV header must have time_s,worker,factor; "
                                 f"missing {', '.join(sorted(missing))}")
    rows: dict[int, list[tuple[float, float]]] = {}
    for row in reader:
        where = f"{source}:{reader.line_num}"
        try:
            t, w, f = float(row["time_s"]), int(row["worker"]), float(row["factor"])
        except (TypeError, ValueError):
            raise StragglerSpecError(f"{where}: expected numbers time_s,worker,factor, "
                                     f"got {row}") from None
        if not (math.isfinite(t) and t >= 0 and w >= 0 and math.isfinite(f) and f > 0):
            raise StragglerSpecError(f"{where}: need time_s >= 0, worker >= 0, factor > 0")
        rows.setdefault(w, []).append((t, f))
    if not rows:
        raise StragglerSpecError(f"{source}: trace has no rows")
    # Stable sort: of two rows for the same worker and time, the later one in the file wins.
    points = {w: _dedupe(sorted(pts, key=lambda p: p[0])) for w, pts in rows.items()}
    return StepFunctionStragglers(points, f"trace:{source}")


def _dedupe(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for t, f in points:
        if out and out[-1][0] == t:
            out[-1] = (t, f)
        else:
            out.append((t, f))
    return out


# path -> the file's text; raises OSError. Only the callers at the edge read files: the parser
# is pure, so it reads a trace through the reader it is given.
TraceReader = Callable[[str], str]


class UnreadTrace(StragglerModel):
    """A trace:FILE term parsed without a reader (a typed value built where no file may be read,
    such as a job spec): it keeps the path; whoever applies the slowdown parses it again with a
    reader."""

    def __init__(self, path: str):
        self.path, self.spec = path, f"trace:{path}"

    def factor(self, worker: int, step: int, t: float) -> float:
        raise StragglerSpecError(f"--straggler {self.spec!r}: the trace was parsed without "
                                 f"reading its file; parse it with a reader to apply it")


def _parse_trace_file(path: str, spec: str, read: TraceReader | None) -> StragglerModel:
    if read is None:
        return UnreadTrace(path)
    try:
        text = read(path)
    except OSError as exc:
        raise StragglerSpecError(f"bad --straggler {spec!r}: cannot read trace {path!r}: "
                                 f"{exc.strerror or exc}") from None
    return parse_trace(text, source=path)


def _parse_term(term: str, spec: str, seed: int, read: TraceReader | None
                ) -> StragglerModel:
    kind, _, body = term.partition(":")
    if term == "none":
        return StragglerModel()
    if kind == "random":
        return _parse_random(body, spec, seed)
    if kind == "schedule":
        return _parse_schedule(body, spec)
    if kind == "trace":
        if not body:
            raise StragglerSpecError(f"bad --straggler {spec!r}: expected trace:FILE.csv")
        return _parse_trace_file(body, spec, read)
    if kind.strip().isdigit():
        return _parse_static(term, spec)
    raise StragglerSpecError(f"bad --straggler {spec!r}: {term!r} is not one of none, "
                             f"WORKER:FACTOR[,...], random:PROB:FACTOR, schedule:..., trace:FILE")


def parse_straggler(spec: str | None, seed: int = 0,
                    read_trace: TraceReader | None = None) -> StragglerModel:
    """Parse a --straggler spec (grammar in STRAGGLER_HELP); `seed` drives `random:` terms;
    `read_trace` reads a trace:FILE term's file (without it, see UnreadTrace)."""
    spec = (spec or "none").strip()
    terms = [t.strip() for t in spec.split("+")]
    if not all(terms):
        raise StragglerSpecError(f"bad --straggler {spec!r}: empty term around '+'")
    models = [_parse_term(t, spec, seed + i, read_trace) for i, t in enumerate(terms)]
    if len(models) == 1:
        return models[0]
    return ProductStragglers(models, spec)


class ParsedStraggler(str):
    """A --straggler value parsed once: it is its text (equal to it, JSON as it) and carries
    the model in `.model`, so the text can travel in a job file without a second parse here."""

    model: StragglerModel

    def __new__(cls, spec: "str | None", seed: int = 0,
                read_trace: TraceReader | None = None) -> "ParsedStraggler":
        model = parse_straggler(spec, seed, read_trace)
        obj = super().__new__(cls, model.spec)
        obj.model = model
        return obj
