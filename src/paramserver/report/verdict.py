"""The report's opening answer: per scenario, which policy reaches the target soonest (and ends
at or above it, when one does), how much sooner than BSP, at what final-accuracy cost, how sure the repeats make it, and who failed why.

Pure: it reads table rows (and the divergence times the caller found), never files, so the
wording can be tested on hand-built rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from paramserver.report.collect import fmt_target
from paramserver.report.core.diagnose import Diagnosis
from paramserver.report.table import BASELINE, Row

# Medians this close count as a tie: repeats are timed to the millisecond at best, so a
# difference below that says nothing about the policies.
TIE_S = 1e-3
# Single runs (no spread to go by) this close count as a tie: a run's time to target on this
# machine swings by about 15% from run to run (benchmarks/README.md), so 5% is no verdict.
TIE_SINGLE = 0.05


def tied(a: Row, b: Row) -> bool:
    """Whether a and b reach the target too close together to name one: with repeats, their
    times overlap (each one's [min, max]); single runs, within TIE_SINGLE of each other."""
    if a.repeats > 1 and b.repeats > 1 and None not in (a.tta_min, a.tta_max, b.tta_min,
                                                          b.tta_max):
        return a.tta_min <= b.tta_max + TIE_S and b.tta_min <= a.tta_max + TIE_S
    return abs(a.tta_median - b.tta_median) <= max(
        TIE_S, TIE_SINGLE * min(a.tta_median, b.tta_median))


@dataclass(frozen=True)
class Verdict:
    scenario: str
    fastest: tuple[str, ...]  # policies tied for the soonest median; empty when none reached
    text: str


def _score(score: str, value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{100 * value:.1f}%" if score == "accuracy" else f"{value:.4f}"


def _confidence(row: Row) -> str:
    if row.repeats == 1:
        return "single run, no spread"
    spread = ("" if row.tta_min is None else
              f", spread {row.tta_min:.2f}–{row.tta_max:.2f} s")
    return f"median of {row.repeats} repeats, {row.reached} reached the target{spread}"


def _cost(best: Row, base: Row, score: str) -> str:
    """Final accuracy against BSP: the price (or gain) of finishing sooner."""
    if best.final_accuracy is None or base.final_accuracy is None:
        return "final accuracy against BSP unknown"
    diff = best.final_accuracy - base.final_accuracy
    unit = f"{100 * diff:+.1f} points" if score == "accuracy" else f"{diff:+.4f}"
    return (f"final {'accuracy' if score == 'accuracy' else 'AUC'} "
            f"{_score(score, best.final_accuracy)} against BSP's "
            f"{_score(score, base.final_accuracy)} ({unit})")


def _against_bsp(best: Row, base: Row | None, score: str) -> str:
    if base is None:
        return "no BSP runs here, so no speedup over BSP can be given"
    if base.tta_median is None:
        return ("BSP never reached the target here, so it is sooner than BSP by more than any "
                "ratio; " + _cost(best, base, score))
    if best.policy == BASELINE:
        return "BSP itself is the soonest"
    saved = base.tta_median - best.tta_median
    ratio = base.tta_median / best.tta_median
    return (f"×{ratio:.2f} sooner than BSP ({saved:.2f} s saved on BSP's "
            f"{base.tta_median:.2f} s); " + _cost(best, base, score))


def _tie_reason(ties: list[Row]) -> str:
    """Why the tied policies are not told apart."""
    if all(r.repeats > 1 for r in ties):
        spans = ", ".join(f"{r.policy} {r.tta_min:.2f}–{r.tta_max:.2f} s" for r in ties)
        return f"Their repeats' times overlap ({spans}): the difference is inside the spread."
    times = ", ".join(f"{r.policy} {r.tta_median:.2f} s" for r in ties)
    return (f"Single runs within {100 * TIE_SINGLE:.0f}% of each other ({times}) are inside a "
            f"run's noise here; --repeats 3 tells them apart, if anything does.")


def _failure(row: Row, score: str, diverged: list[float]) -> str:
    """Why a policy has no time to target, as far as its logs show."""
    missed = row.repeats - row.reached

    def share(n: int) -> str:
        return "" if n == row.repeats else f" in {n} of {row.repeats} repeats"

    # best_accuracy is a median over all repeats: it describes the misses only when all missed.
    best = f" (best {_score(score, row.best_accuracy)})" if missed == row.repeats else ""
    never = f"never reached the target within the run's budget{share(missed - len(diverged))}{best}"
    if not diverged:
        return f"{row.policy} {never}"
    out = (f"{row.policy} diverged{share(len(diverged))}: its test loss became NaN or infinite "
           f"from {min(diverged):.1f} s on, so its accuracy fell to chance; a smaller lr, or a "
           "staleness-aware optimizer for the asynchronous policies, keeps it stable")
    # A repeat can also miss without diverging: say so, or the count would not add up.
    return out + (f", and it {never}" if missed > len(diverged) else "")


def _unmeasured(scenario: str, rows: list[Row]) -> str:
    """No run measured accuracy (a simulation without --train): the answer is throughput."""
    text = (f"On {scenario}, no test accuracy was measured (a simulation without --train, or "
            f"runs without an evaluator), so there is no time to target")
    if not rows:
        return text + "."
    top = max(rows, key=lambda r: r.samples_per_s)
    text += (f"; by throughput, {top.policy} trains the most samples per second: "
             f"{top.samples_per_s:,.0f}, waiting {100 * top.wait_fraction:.1f}% of the time")
    base = next((r for r in rows if r.policy == BASELINE), None)
    if base is not None and top is not base and base.samples_per_s > 0:
        text += f" (x{top.samples_per_s / base.samples_per_s:.2f} BSP's)"
    return text + ". More samples per second is not sooner accuracy when pushes are stale."


def scenario_verdict(scenario: str, rows: list[Row], target: float, score: str = "accuracy",
                     diverged: dict[str, list[float]] | None = None,
                     diagnoses: dict[str, Diagnosis] | None = None) -> Verdict:
    """One paragraph for one scenario; rows are its table rows, the reference run included.

    diverged maps a policy to the times its repeats' test loss stopped being finite;
    diagnoses, a policy to what its failed repeats had, with cause and fix
    (report/core/diagnose.py): where one is given it replaces the generic reason."""
    diverged, diagnoses = diverged or {}, diagnoses or {}

    def why(r: Row) -> str:
        d = diagnoses.get(r.policy)
        return d.line(r.policy) if d is not None else _failure(r, score, diverged.get(r.policy, []))

    # The one-worker reference is not a policy a user can pick: it never wins the verdict.
    rows = [r for r in rows if not r.reference]
    goal = fmt_target(score, target)
    reached = sorted((r for r in rows if r.tta_median is not None), key=lambda r: r.tta_median)
    failed = [why(r) for r in rows if r.tta_median is None]
    if not reached and all(r.best_accuracy is None and r.final_accuracy is None
                           and not diverged.get(r.policy) for r in rows):
        return Verdict(scenario, (), _unmeasured(scenario, rows))
    if not reached:
        text = f"On {scenario}, no policy reached {goal}."
        return Verdict(scenario, (), text + ("" if not failed else " " + "; ".join(failed) + "."))
    # A policy that crossed the target and ended below it is not the answer while another
    # crossed it and stayed: a user keeps the final model, not the best moment of the run.
    held = [r for r in reached if r.final_accuracy is None or r.final_accuracy >= target]
    dropped = [r for r in reached if r not in held]
    pool = held or reached
    best = pool[0]
    ties = [r for r in pool if tied(r, best)]
    # Among tied policies, BSP is named first: it needs no staleness, so it is the safe pick.
    ties.sort(key=lambda r: r.policy != BASELINE)
    best = ties[0]
    # A policy that ran with its own update rule (compare's pairing) is named with it.
    names = " and ".join(f"{r.policy} (with {r.optimizer})" if r.own_rule else r.policy
                         for r in ties)
    base = next((r for r in rows if r.policy == BASELINE), None)
    lead = (f"On {scenario}, {names} {'tie as' if len(ties) > 1 else 'is'} the soonest to "
            f"reach {goal}: {best.tta_median:.2f} s ({_confidence(best)}); "
            + _against_bsp(best, base, score) + ".")
    if len(ties) > 1:
        lead += " " + _tie_reason(ties)
    sooner = [r for r in dropped if held and r.tta_median < best.tta_median - TIE_S]
    if sooner:
        lead += (" Sooner, but ended below the target: " + "; ".join(
            f"{r.policy} reached it at {r.tta_median:.2f} s and ended at "
            f"{_score(score, r.final_accuracy)}" for r in sooner) + ".")
    if failed:
        lead += " Without a time to target: " + "; ".join(failed) + "."
    # Failures that only some repeats had: the median reached, so they are not named above.
    partial = [why(r) for r in reached if r.reached < r.repeats]
    if partial:
        lead += " Not every repeat reached it: " + "; ".join(partial) + "."
    # Every repeat reached the target, and some fell away from it afterwards.
    lost = [why(r) for r in reached if r.reached == r.repeats and r.policy in diagnoses]
    if lost:
        lead += " Reached, then lost: " + "; ".join(lost) + "."
    return Verdict(scenario, tuple(r.policy for r in ties), lead)


def verdicts(rows: list[Row], target: float, score: str = "accuracy",
             diverged: dict[tuple[str, str], list[float]] | None = None,
             diagnoses: dict[tuple[str, str], Diagnosis] | None = None) -> list[Verdict]:
    """A verdict per scenario, in the rows' order; diverged and diagnoses are keyed by
    (scenario, policy)."""
    diverged, diagnoses = diverged or {}, diagnoses or {}
    out = []
    for scenario in dict.fromkeys(r.scenario for r in rows):
        mine = {p: t for (s, p), t in diverged.items() if s == scenario}
        why = {p: d for (s, p), d in diagnoses.items() if s == scenario}
        out.append(scenario_verdict(scenario, [r for r in rows if r.scenario == scenario],
                                    target, score, mine, why))
    return out
