"""How many samples a policy needs to reach a target accuracy, fitted from live runs.

samples = E_ref x (1 + B/B_crit)/(1 + B_ref/B_crit) x (1 + alpha s)/(1 + alpha s_ref)

E_ref is the median samples-to-target of the live runs of the policy (or, when the policy was
not run, of its apply mode) at their own update batch B_ref (samples per applied update) and
mean staleness s_ref. The batch term is the critical-batch model of McCandlish et al. ("An
Empirical Model of Large-Batch Training"): below B_crit a bigger update batch costs few extra
samples, above it each doubling costs nearly double. alpha is the price of one step of
staleness. The band is the reference runs' spread; a staleness at or beyond the smallest one
at which live runs never reached the target predicts None.

The share of runs that reach the target at all (`reach`): exp(-hazard x s), each step of
staleness a like chance to diverge, with the hazard fitted to the reference's runs (which
reached at which staleness; see advise.core.fit_convergence). Lockstep runs have no staleness
to fit one by: their share that did not fail (diverge or collapse) is theirs at any. A
reference from a file of before has only its reached / runs = q at its staleness: q there and
below, q ** (s / s_ref) beyond. At 4 workers ASP reached 0.95 in 5 of 8 calibration runs at
staleness 2.9; at 8 workers (staleness about 6.5) it diverged in every live run, where that
predicts 0.34.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

VERSION = 1
APPLY_MODES = ("arrival", "round")
NEVER_MARGIN = 0.5  # a never-reaching policy may reach at under this share of its staleness


class ConvergenceError(ValueError):
    """A convergence model file that cannot be read: wrong version, missing or bad field."""


@dataclass(frozen=True)
class Band:
    """A prediction and its spread: lo <= mid <= hi."""
    lo: float
    mid: float
    hi: float

    def __post_init__(self):
        if not (self.lo <= self.mid <= self.hi):
            raise ValueError(f"band must have lo <= mid <= hi, got {self.lo}, {self.mid}, "
                             f"{self.hi}")

    def scaled(self, factor: float) -> "Band":
        return Band(self.lo * factor, self.mid * factor, self.hi * factor)


@dataclass(frozen=True)
class Reference:
    """What the live runs of one policy (or one apply mode) measured.

    samples: median samples to target over the runs that reached it, None when none did.
    lo_ratio/hi_ratio: the spread of those runs around the median (lo <= 1 <= hi).
    never_staleness: the smallest mean staleness among runs that never reached the target
    and was above every run that did (at least two such runs); None otherwise.
    """
    apply_mode: str
    samples: float | None
    update_batch: float
    staleness: float
    lo_ratio: float = 1.0
    hi_ratio: float = 1.0
    runs: int = 0
    reached: int = 0
    never_staleness: float | None = None
    hazard: float | None = None  # per step of staleness (None: not fitted, see reach)
    failed: int | None = None  # runs that diverged or collapsed (None: not counted)

    def __post_init__(self):
        if self.apply_mode not in APPLY_MODES:
            raise ConvergenceError(f"apply_mode must be one of {APPLY_MODES}, "
                                   f"got {self.apply_mode!r}")
        if self.samples is not None and not (self.samples > 0 and math.isfinite(self.samples)):
            raise ConvergenceError(f"samples must be a positive number, got {self.samples!r}")
        if not self.update_batch > 0:
            raise ConvergenceError(f"update_batch must be > 0, got {self.update_batch!r}")
        if not self.staleness >= 0:
            raise ConvergenceError(f"staleness must be >= 0, got {self.staleness!r}")
        if not (0 < self.lo_ratio <= 1.0 <= self.hi_ratio):
            raise ConvergenceError(f"need 0 < lo_ratio <= 1 <= hi_ratio, got "
                                   f"{self.lo_ratio}, {self.hi_ratio}")
        if self.hazard is not None and not (self.hazard >= 0 and math.isfinite(self.hazard)):
            raise ConvergenceError(f"hazard must be a finite number >= 0, got {self.hazard!r}")

    def to_json(self) -> dict:
        return {"apply_mode": self.apply_mode, "samples": self.samples,
                "update_batch": self.update_batch, "staleness": self.staleness,
                "lo_ratio": self.lo_ratio, "hi_ratio": self.hi_ratio, "runs": self.runs,
                "reached": self.reached, "never_staleness": self.never_staleness,
                "hazard": self.hazard, "failed": self.failed}

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Reference":
        if not isinstance(d, dict):
            raise ConvergenceError(f"{where} must be an object, got {type(d).__name__}")
        names = {"apply_mode", "samples", "update_batch", "staleness", "lo_ratio", "hi_ratio",
                 "runs", "reached", "never_staleness", "hazard", "failed"}
        unknown = set(d) - names
        if unknown:
            raise ConvergenceError(f"{where}: unknown fields {sorted(unknown)}")
        try:
            return cls(apply_mode=d["apply_mode"], samples=_opt_float(d.get("samples")),
                       update_batch=float(d["update_batch"]), staleness=float(d["staleness"]),
                       lo_ratio=float(d.get("lo_ratio", 1.0)),
                       hi_ratio=float(d.get("hi_ratio", 1.0)), runs=int(d.get("runs", 0)),
                       reached=int(d.get("reached", 0)),
                       never_staleness=_opt_float(d.get("never_staleness")),
                       hazard=_opt_float(d.get("hazard")),
                       failed=None if d.get("failed") is None else int(d["failed"]))
        except KeyError as e:
            raise ConvergenceError(f"{where}: missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ConvergenceError(f"{where}: {e}") from None


def _opt_float(v) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True)
class ConvergenceModel:
    version: int
    target: float
    b_crit: float
    # alpha per apply mode: staleness hurts a round-mode policy (versions advance per round)
    # differently from an arrival-mode one.
    alpha: dict[str, float]
    policies: dict[str, Reference]
    modes: dict[str, Reference]
    # Where the fit came from (command, date, data): carried, never interpreted.
    source: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.version != VERSION:
            raise ConvergenceError(f"convergence model version {self.version!r} is not "
                                   f"{VERSION}; refit it with `paramserver calibrate`")
        if not 0 < self.target <= 1:
            raise ConvergenceError(f"target must be an accuracy in (0, 1], got {self.target!r}")
        if not (self.b_crit > 0 and math.isfinite(self.b_crit)):
            raise ConvergenceError(f"b_crit must be a positive number, got {self.b_crit!r}")
        for mode, a in self.alpha.items():
            if mode not in APPLY_MODES or not (a >= 0 and math.isfinite(a)):
                raise ConvergenceError(f"alpha[{mode!r}] must be >= 0 for an apply mode, "
                                       f"got {a!r}")
        for mode in self.modes:
            if mode not in APPLY_MODES:
                raise ConvergenceError(f"modes: unknown apply mode {mode!r}")

    def reference(self, policy: str, apply_mode: str) -> Reference | None:
        """The live runs a prediction scales from: the policy's own when they ran in this
        apply mode, else the apply mode's, else any mode's."""
        ref = self.policies.get(policy)
        if ref is not None and ref.apply_mode == apply_mode:
            return ref
        if apply_mode in self.modes:
            return self.modes[apply_mode]
        return next(iter(self.modes.values()), None)

    def samples_needed(self, policy: str, *, apply_mode: str, update_batch: float,
                       staleness: float) -> Band | None:
        """Samples the job must process to reach `target`; None: predicted never to reach
        (diverges or plateaus below the target) at this staleness/batch."""
        if apply_mode not in APPLY_MODES:
            raise ValueError(f"apply_mode must be one of {APPLY_MODES}, got {apply_mode!r}")
        if not update_batch > 0 or not staleness >= 0:
            raise ValueError(f"need update_batch > 0 and staleness >= 0, got "
                             f"{update_batch!r}, {staleness!r}")
        ref = self.reference(policy, apply_mode)
        if ref is None:
            raise ValueError("the convergence model holds no live runs to scale from")
        own = self.policies.get(policy)
        if own is not None and own.apply_mode == apply_mode and own.samples is None:
            # The policy never reached the target where it ran. Why is not known (its own
            # dynamics, SSP's same-version sums, as much as its staleness): predict never
            # unless the staleness is well below its runs' (under half), then scale from its
            # apply mode.
            if staleness >= own.staleness * NEVER_MARGIN or apply_mode not in self.modes:
                return None
            ref = self.modes[apply_mode]
        if ref.samples is None:
            return None
        limit = ref.never_staleness
        if limit is not None and staleness >= limit:
            return None
        alpha = self.alpha.get(apply_mode, 0.0)
        factor = ((1 + update_batch / self.b_crit) / (1 + ref.update_batch / self.b_crit)
                  * (1 + alpha * staleness) / (1 + alpha * ref.staleness))
        mid = ref.samples * factor
        return Band(mid * ref.lo_ratio, mid, mid * ref.hi_ratio)

    def reach(self, policy: str, *, apply_mode: str, staleness: float) -> float:
        """The share of runs predicted to reach the target (see the module doc); 1.0 when the
        reference's runs say nothing (none recorded)."""
        ref = self.reference(policy, apply_mode)
        if ref is not None and ref.hazard is not None:
            return math.exp(-ref.hazard * staleness)
        if ref is not None and ref.failed is not None:  # no staleness to scale by: its share
            seen = ref.reached + ref.failed
            return 1.0 - ref.failed / seen if seen else 1.0
        if ref is None or ref.runs <= 0:
            return 1.0
        q = ref.reached / ref.runs
        if ref.staleness <= 0 or staleness <= ref.staleness:
            return q
        return q ** (staleness / ref.staleness)

    def to_json(self) -> dict:
        return {"version": self.version, "target": self.target, "b_crit": self.b_crit,
                "alpha": dict(self.alpha),
                "policies": {p: r.to_json() for p, r in sorted(self.policies.items())},
                "modes": {m: r.to_json() for m, r in sorted(self.modes.items())},
                "source": dict(self.source)}

    @classmethod
    def from_json(cls, d: dict) -> "ConvergenceModel":
        if not isinstance(d, dict):
            raise ConvergenceError(f"a convergence model is a JSON object, got "
                                   f"{type(d).__name__}")
        if "convergence" in d:
            d = d["convergence"]  # a whole calibration.json
            if not isinstance(d, dict):
                raise ConvergenceError("calibration file: 'convergence' must be an object")
        if d.get("version") != VERSION:
            raise ConvergenceError(f"convergence model version {d.get('version')!r} is not "
                                   f"{VERSION}; refit it with `paramserver calibrate`")
        names = {"version", "target", "b_crit", "alpha", "policies", "modes", "source"}
        unknown = set(d) - names
        if unknown:
            raise ConvergenceError(f"convergence model: unknown fields {sorted(unknown)}")
        for key in ("alpha", "policies", "modes"):
            if key in d and not isinstance(d[key], dict):
                raise ConvergenceError(f"convergence model: {key!r} must be an object of "
                                       f"name: value pairs, got {type(d[key]).__name__}; refit "
                                       f"it with `paramserver calibrate`")
        try:
            policies = {str(p): Reference.from_json(r, f"policies[{p!r}]")
                        for p, r in d["policies"].items()}
            modes = {str(m): Reference.from_json(r, f"modes[{m!r}]")
                     for m, r in d["modes"].items()}
            return cls(version=VERSION, target=float(d["target"]), b_crit=float(d["b_crit"]),
                       alpha={str(k): float(v) for k, v in d["alpha"].items()},
                       policies=policies, modes=modes, source=dict(d.get("source", {})))
        except KeyError as e:
            raise ConvergenceError(f"convergence model: missing field {e.args[0]!r}") from None
        except (AttributeError, TypeError, ValueError) as e:
            if isinstance(e, ConvergenceError):
                raise
            raise ConvergenceError(f"convergence model: {e}") from None
