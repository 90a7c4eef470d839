"""Why a run has no time to target: diverged, fell to chance or plateaued, with a one-line cause
and fix written for its policy and settings.

Pure: it reads numbers the caller took from a run's summary, never files, so each wording can
be tested on hand-made values.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from paramserver.optim import UPDATE_RULES
from paramserver.policies import SYNC_POLICIES

# An accuracy within this many points of chance (1 / classes) counts as chance: a model that
# predicts one class everywhere scores exactly chance on a balanced test split, give or take
# the split's rounding.
CHANCE_MARGIN = 0.05
# A run whose final score lies this far below its best collapsed, even if it did not reach
# chance: a stable run ends near its best.
COLLAPSE_DROP = 0.1

# Most severe first: a row of repeats is described by its most severe failure.
KINDS = ("diverged", "chance", "collapsed", "plateaued")
LABELS = {"diverged": "diverged", "chance": "fell to chance",
          "collapsed": "accuracy collapsed", "plateaued": "plateaued below the target"}


def _bounded(policy: str) -> bool:
    """A bounded-staleness policy: under a persistent straggler its bound binds every step."""
    return policy in SYNC_POLICIES and SYNC_POLICIES.get(policy).bounded


def _arrival(policy: str) -> bool:
    """A policy whose servers apply single workers' pushes on arrival, at the full lr each."""
    return policy in SYNC_POLICIES and SYNC_POLICIES.get(policy).apply_mode == "arrival"


def _aware(rule: str | None) -> bool:
    """An update rule that shrinks a stale push's step."""
    return rule in UPDATE_RULES and UPDATE_RULES.get(rule).staleness_aware


@dataclass(frozen=True)
class RunOutcome:
    """What one run's summary says about its end."""

    reached: bool  # its score reached the target at some time
    final: float | None  # final test score (accuracy, or AUC)
    best: float | None
    diverged_at: float | None  # when its test loss stopped being finite, if it did


@dataclass(frozen=True)
class Setting:
    """What the fix depends on: the policy and the settings its runs had."""

    policy: str
    optimizer: str = "sgd"
    lr: float | None = None
    workers: int | None = None
    straggler: str = "none"
    staleness: float = 0.0  # mean over the repeats' steps
    budget: str = "--epochs"  # the flag that set the runs' budget (budget_flag)


@dataclass(frozen=True)
class Diagnosis:
    kind: str  # one of KINDS
    runs: int  # repeats with this failure
    repeats: int
    cause: str
    fix: str
    others: tuple[tuple[str, int], ...] = ()  # the repeats' other failures: (kind, count)

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    def line(self, policy: str) -> str:
        """'ssp fell to chance in 2 of 3 repeats: CAUSE; FIX'."""
        def share(n: int) -> str:
            return "" if n == self.repeats else f" in {n} of {self.repeats} repeats"

        # The other failures are counted too, or the repeats would not add up.
        rest = ("" if not self.others else
                " (and " + ", ".join(f"{LABELS[k]}{share(n)}" for k, n in self.others) + ")")
        return f"{policy} {self.label}{share(self.runs)}{rest}: {self.cause}; {self.fix}"


def classify(run: RunOutcome, chance: float | None) -> str | None:
    """The run's failure (a KINDS entry), or None when it reached the target and ended near
    its best. A run that reached the target and collapsed afterwards is still named."""
    if run.diverged_at is not None:
        return "diverged"
    final, best = run.final, run.best
    if final is not None and chance is not None and final <= chance + CHANCE_MARGIN:
        return "chance"
    if final is not None and best is not None and best - final >= COLLAPSE_DROP:
        return "collapsed"
    return None if run.reached else "plateaued"


def budget_flag(config: dict) -> str:
    """The flag that set a run's budget, from its config.json's `config`: `--steps` when
    given, else `--epochs` for the built-in task (a user script's run has no epochs: `compare`
    refuses the flag for it), else `--max-seconds`."""
    if config.get("steps"):
        return "--steps"
    if "epochs" in config or not config.get("max_seconds"):
        return "--epochs"  # the built-in task, or a run folder without its settings
    return "--max-seconds"


def _persistent(straggler: str) -> bool:
    """A fixed slow worker (`1:3`, `1:3,2:2`), not random or scheduled slowness."""
    text = straggler.strip().lower()
    return bool(text) and text != "none" and not text.startswith(("random", "schedule", "trace"))


def _lr(value: float | None, factor: float) -> str:
    return "a smaller --lr" if value is None else f"--lr {value * factor:.2g}"


def _unstable(s: Setting) -> tuple[str, str]:
    """(cause, fix) of a run whose updates blew up: policy by policy."""
    lr = "its lr" if s.lr is None else f"lr {s.lr:g}"
    n = s.workers or 4
    aware = _aware(s.optimizer)
    if _bounded(s.policy) and _persistent(s.straggler) and not aware:
        return (f"{s.policy.upper()} at {lr} sums same-version gradients under a persistent "
                f"straggler: each push of the straggler releases the {n - 1} waiting workers "
                f"together, and arrival mode applies each of their gradients at the full lr, a "
                f"step up to {n}x BSP's average",
                f"use --optimizer dynsgd or {_lr(s.lr, 1 / n)}")
    if _arrival(s.policy) and not aware:
        return (f"{s.policy.upper()} applies every push at the full {lr} with mean staleness "
                f"{s.staleness:.1f}: stale gradients overshoot",
                f"use --optimizer dynsgd or {_lr(s.lr, 1 / 3)}")
    if _arrival(s.policy):
        return (f"{s.policy.upper()} is unstable at {lr} even with {s.optimizer}",
                f"use {_lr(s.lr, 1 / 2)}")
    return (f"{lr} is too large for {s.policy.upper()}'s averaged step", f"use {_lr(s.lr, 1 / 2)}")


def _plateau(s: Setting, best: float | None, score: str) -> tuple[str, str]:
    shown = "unknown" if best is None else (
        f"{100 * best:.1f}%" if score == "accuracy" else f"{best:.4f}")
    if _arrival(s.policy) and s.staleness >= 1 and _aware(s.optimizer):
        return (f"the sample budget ran out first (best {shown}); {s.optimizer} shrinks the "
                f"steps of stale pushes (mean staleness {s.staleness:.1f})",
                f"use more {s.budget}, or a larger --lr")
    if _arrival(s.policy) and s.staleness >= 1:
        return (f"the sample budget ran out first (best {shown}); stale pushes (mean staleness "
                f"{s.staleness:.1f}) learn less per sample", f"use more {s.budget}")
    return (f"the sample budget ran out first (best {shown})",
            f"use more {s.budget}, or a larger --lr")


def diagnose(setting: Setting, runs: list[RunOutcome], chance: float | None,
             score: str = "accuracy") -> Diagnosis | None:
    """The most severe failure among a policy's repeats, with its cause and fix, or None when
    every repeat reached the target and kept it."""
    classes = [classify(r, chance) for r in runs]
    counts = Counter(k for k in classes if k is not None)
    if not counts:
        return None
    kind = next(k for k in KINDS if k in counts)
    if kind == "plateaued":  # the best of the repeats that plateaued, not of those that reached
        best = max((r.best for r, k in zip(runs, classes) if k == kind and r.best is not None),
                   default=None)
        cause, fix = _plateau(setting, best, score)
    else:
        cause, fix = _unstable(setting)
        if kind == "diverged":
            first = min(r.diverged_at for r in runs if r.diverged_at is not None)
            cause = f"test loss NaN or infinite from {first:.1f} s; " + cause
        elif kind == "chance":
            cause = "the loss stayed finite but the model predicts one class; " + cause
    others = tuple((k, counts[k]) for k in KINDS if k in counts and k != kind)
    return Diagnosis(kind, counts[kind], len(runs), cause, fix, others)
