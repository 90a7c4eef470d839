"""Per-worker compute-time models (`--compute`): a small registry of terms that multiply."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable

import numpy as np

from paramserver.core.registry import Registry
from paramserver.core.units import UnitError, parse_duration

COMPUTE_HELP = """\
compute time of one worker step, before the --straggler factor (COST is per sample):
  const:COST                every step takes batch x COST, e.g. const:2ms
  lognormal:COST:SIGMA      batch x COST x a mean-1 lognormal draw per worker step (SIGMA: std
                            of its log), e.g. lognormal:2ms:0.3; lognormal:SIGMA is noise only
  classes:F=X,F=X,...       worker classes: fraction F of the ranks (in rank order) is X times
                            slower, e.g. classes:0.9=1,0.1=3 (fractions sum to 1)
  trace:FILE                replay each worker's recorded compute_s in step order from a run's
                            metrics.jsonl (or its folder) or a CSV worker,compute_s[,step][,batch];
                            worker w replays recorded worker w mod n, wrapping round its steps,
                            scaled by batch / recorded batch
  A+B                       terms multiply, e.g. classes:0.9=1,0.1=3+lognormal:0.2; a spec
                            without a COST term (const, lognormal:COST, trace) costs 2ms/sample"""

DEFAULT_COST = 2e-3  # seconds per sample when no term gives a cost

# (worker, step, batch) -> seconds, or a dimensionless multiplier for factor terms
StepFn = Callable[[int, int, int], float]


class ComputeSpecError(ValueError):
    """A --compute spec that does not follow the grammar."""


class Term:
    """One parsed term; `bind` turns it into a function for a job of a given size."""

    spec = ""
    has_cost = False  # True: the term's value is seconds; False: a multiplier

    def bind(self, workers: int, steps: int, seed: int) -> StepFn:
        raise NotImplementedError


class Const(Term):
    has_cost = True

    def __init__(self, cost: float):
        self.cost = cost

    def bind(self, workers, steps, seed):
        c = self.cost
        return lambda w, s, b: b * c


class LogNormal(Term):
    """Mean-1 lognormal noise per (worker, step), drawn up front: one array lookup per step."""

    def __init__(self, sigma: float, cost: float | None):
        self.sigma, self.cost, self.has_cost = sigma, cost, cost is not None

    def bind(self, workers, steps, seed):
        rng = np.random.default_rng([int(seed), 0x5EED])
        draws = rng.lognormal(-self.sigma ** 2 / 2, self.sigma, size=workers * steps)
        noise = array("d", draws.tobytes())  # indexing an array gives Python floats, fast
        n = steps
        if self.cost is None:
            return lambda w, s, b: noise[w * n + s % n]
        c = self.cost
        return lambda w, s, b: b * c * noise[w * n + s % n]


class Classes(Term):
    """Contiguous blocks of ranks: with classes:0.9=1,0.1=3 the last tenth is 3x slower."""

    def __init__(self, shares: list[tuple[float, float]]):
        self.shares = shares

    def multipliers(self, workers: int) -> list[float]:
        out: list[float] = []
        cum = 0.0
        for fraction, mult in self.shares:
            cum += fraction
            out += [mult] * (round(cum * workers) - len(out))
        return out + [self.shares[-1][1]] * (workers - len(out))

    def bind(self, workers, steps, seed):
        mult = self.multipliers(workers)
        return lambda w, s, b: mult[w]


# path -> per recorded worker, its steps' (compute_s, batch); raises ValueError or OSError.
# The parser is pure: the caller (sim.run) hands it sim.trace.load_trace, which reads the file.
TraceLoader = Callable[[str], list[list[tuple[float, int]]]]


class Replay(Term):
    has_cost = True

    def __init__(self, path: str, traces: list[list[tuple[float, int]]]):
        self.path, self.traces = path, traces

    def bind(self, workers, steps, seed):
        traces, n = self.traces, len(self.traces)

        def replay(w: int, s: int, b: int) -> float:
            seq = traces[w % n]
            c, rb = seq[s % len(seq)]
            return c if b == rb else c * b / rb
        return replay


# ---- parsing ------------------------------------------------------------------------------------
def _float(text: str, what: str, spec: str, positive: bool = True) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ComputeSpecError(f"bad --compute {spec!r}: {what} must be a number "
                               f"{'> 0' if positive else '>= 0'}, got {text!r}")
    return v


def _cost(text: str, spec: str) -> float:
    try:
        return parse_duration(text.removesuffix("/sample"), "cost per sample", allow_zero=False)
    except UnitError as exc:
        raise ComputeSpecError(f"bad --compute {spec!r}: {exc}") from None


TERMS: Registry[Callable[[str, str], Term]] = Registry("compute model")


@TERMS.register("const")
def _const(body: str, spec: str) -> Term:
    return Const(_cost(body, spec))


@TERMS.register("lognormal")
def _lognormal(body: str, spec: str) -> Term:
    parts = body.split(":")
    if len(parts) not in (1, 2) or not all(parts):
        raise ComputeSpecError(f"bad --compute {spec!r}: expected lognormal:COST:SIGMA or "
                               f"lognormal:SIGMA, e.g. lognormal:2ms:0.3")
    cost = _cost(parts[0], spec) if len(parts) == 2 else None
    return LogNormal(_float(parts[-1], "sigma", spec, positive=False), cost)


@TERMS.register("classes")
def _classes(body: str, spec: str) -> Term:
    shares = []
    for item in body.split(","):
        frac, sep, mult = item.partition("=")
        if not sep:
            raise ComputeSpecError(f"bad --compute {spec!r}: expected FRACTION=SLOWDOWN pairs "
                                   f"like classes:0.9=1,0.1=3, got {item!r}")
        shares.append((_float(frac, "fraction", spec), _float(mult, "slowdown", spec)))
    if abs(sum(f for f, _ in shares) - 1) > 1e-6:
        raise ComputeSpecError(f"bad --compute {spec!r}: fractions must sum to 1")
    return Classes(shares)


@TERMS.register("trace")
def _trace(body: str, spec: str, load: TraceLoader | None = None) -> Term:
    if not body:
        raise ComputeSpecError(f"bad --compute {spec!r}: expected trace:FILE")
    if load is None:
        raise ComputeSpecError(f"bad --compute {spec!r}: a trace is read by the caller; parse "
                               f"it with load_trace")
    try:
        return Replay(body, load(body))
    except (ValueError, OSError) as exc:
        raise ComputeSpecError(f"bad --compute {spec!r}: {exc}") from None


class ComputeModel:
    """The product of the spec's terms; `bind` gives cost(worker, step, batch) in seconds."""

    def __init__(self, spec: str, terms: list[Term]):
        self.spec, self.terms = spec, terms

    def bind(self, workers: int, steps: int, seed: int = 0) -> StepFn:
        fns = [t.bind(workers, steps, seed + i) for i, t in enumerate(self.terms)]
        if not any(t.has_cost for t in self.terms):
            fns.insert(0, Const(DEFAULT_COST).bind(workers, steps, seed))
        if len(fns) == 1:
            return fns[0]
        if len(fns) == 2:
            f, g = fns
            return lambda w, s, b: f(w, s, b) * g(w, s, b)
        return lambda w, s, b: math.prod(fn(w, s, b) for fn in fns)


def parse_compute(spec: str | None, load_trace: TraceLoader | None = None) -> ComputeModel:
    """Parse a --compute spec (grammar in COMPUTE_HELP); `load_trace` reads a trace:FILE term."""
    spec = (spec or "const:2ms").strip()
    terms = []
    for raw in spec.split("+"):
        kind, _, body = raw.strip().partition(":")
        if kind not in TERMS:
            raise ComputeSpecError(f"bad --compute {spec!r}: unknown model {kind!r}; known: "
                                   f"{', '.join(TERMS.names())}")
        make = TERMS.get(kind)
        terms.append(make(body.strip(), spec, load_trace) if kind == "trace"
                     else make(body.strip(), spec))
    if sum(t.has_cost for t in terms) > 1:
        raise ComputeSpecError(f"bad --compute {spec!r}: only one term may give the cost "
                               f"(const:COST, lognormal:COST:SIGMA or trace:FILE)")
    return ComputeModel(spec, terms)
