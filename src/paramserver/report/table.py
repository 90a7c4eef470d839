"""The time-to-target-accuracy table: one row per scenario and policy, over repeats."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from statistics import mean, median

from paramserver.report.collect import SINGLE, Collection, Run, fmt_target

BASELINE = "bsp"  # speedups are against this policy in the same scenario


@dataclass
class Row:
    """One policy in one scenario, aggregated over its repeats."""

    scenario: str
    policy: str
    repeats: int
    reached: int  # repeats that reached the target
    tta_median: float | None  # None: the median repeat never reached the target
    tta_min: float | None  # over the repeats that reached it
    tta_max: float | None
    final_accuracy: float | None
    best_accuracy: float | None
    wait_fraction: float
    staleness: float
    samples_per_s: float
    real_compute_share: float | None
    push_bytes: float | None = None  # per worker step, median over repeats
    pull_bytes: float | None = None
    push_codecs: tuple[str, ...] = ()  # the formats its steps named, over repeats (none: dense)
    pull_codecs: tuple[str, ...] = ()
    push_saved: float | None = None  # bytes per step saved against float32, median; None: dense
    pull_saved: float | None = None
    speedup: float | None = None  # median BSP time / median time of this policy
    score: str = "accuracy"  # what final/best_accuracy hold: accuracy, or AUC (click models)
    optimizer: str | None = None  # the update rule its runs had, when they agree
    own_rule: bool = False  # its rule differs from BSP's in the scenario (compare's pairing)

    @property
    def reference(self) -> bool:
        return self.policy == SINGLE


def _median_or_none(values) -> float | None:
    values = [v for v in values if v is not None]
    return median(values) if values else None


def _union(lists) -> tuple[str, ...]:
    return tuple(sorted({str(c) for codecs in lists if isinstance(codecs, list) for c in codecs}))


def policy_row(scenario: str, policy: str, runs: list[Run], target: float,
               score: str = "accuracy") -> Row:
    """Aggregate the repeats of one policy; a repeat that never reached the target counts as
    infinitely slow, so the median is "not reached" once half of them missed it."""
    times = [run.time_to(target) for run in runs]
    reached = sorted(t for t in times if t is not None)
    mid = median([math.inf if t is None else t for t in times])
    s = [run.summary for run in runs]
    return Row(
        scenario=scenario, policy=policy, repeats=len(runs), reached=len(reached),
        tta_median=None if math.isinf(mid) else mid,
        tta_min=reached[0] if reached else None, tta_max=reached[-1] if reached else None,
        final_accuracy=_median_or_none(x.get(f"final_test_{score}") for x in s),
        best_accuracy=_median_or_none(x.get(f"best_test_{score}") for x in s), score=score,
        wait_fraction=mean(x.get("mean_wait_fraction") or 0.0 for x in s),
        staleness=mean(x.get("mean_staleness") or 0.0 for x in s),
        samples_per_s=median(run.samples_per_s for run in runs),
        real_compute_share=_median_or_none(x.get("real_compute_share") for x in s),
        push_bytes=_median_or_none(x.get("push_bytes_per_step") for x in s),
        pull_bytes=_median_or_none(x.get("pull_bytes_per_step") for x in s),
        push_codecs=_union(x.get("push_codecs") for x in s),
        pull_codecs=_union(x.get("pull_codecs") for x in s),
        push_saved=_median_or_none(x.get("push_saved_bytes_per_step") for x in s),
        pull_saved=_median_or_none(x.get("pull_saved_bytes_per_step") for x in s),
        optimizer=(lambda rules: rules.pop() if len(rules) == 1 else None)(
            {x.get("optimizer") for x in s}))


def table_rows(collection: Collection, target: float | None = None) -> list[Row]:
    """Rows of every scenario in order, the single-process reference last in each."""
    target = collection.target if target is None else target
    rows = []
    for scenario in collection.scenarios():
        group = [policy_row(scenario, p, collection.select(scenario, p), target,
                            collection.score)
                 for p in collection.policies(scenario)]
        base = next((r.tta_median for r in group if r.policy == BASELINE), None)
        rule = next((r.optimizer for r in group if r.policy == BASELINE), None)
        for row in group:
            row.own_rule = rule is not None and row.optimizer not in (None, rule)
            if base is not None and row.tta_median:
                row.speedup = base / row.tta_median
        rows.extend(group)
    return rows


def fmt_seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f}"


def fmt_pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _cells(row: Row) -> list[str]:
    spread = ("–" if row.tta_min is None else f"{row.tta_min:.2f}" if row.tta_min == row.tta_max
              else f"{row.tta_min:.2f}–{row.tta_max:.2f}")
    name = f"{row.policy} (reference)" if row.reference else (
        f"{row.policy} ({row.optimizer})" if row.own_rule else row.policy)
    return [name, f"{row.reached}/{row.repeats}", fmt_seconds(row.tta_median), spread,
            "–" if row.speedup is None else f"×{row.speedup:.2f}",
            fmt_score(row.score, row.final_accuracy), fmt_score(row.score, row.best_accuracy),
            fmt_pct(row.wait_fraction),
            f"{row.staleness:.2f}", f"{row.samples_per_s:.0f}",
            fmt_bytes_saved(row.push_bytes, row.push_saved),
            fmt_bytes_saved(row.pull_bytes, row.pull_saved),
            fmt_codecs(row.push_codecs, row.pull_codecs)]


def fmt_bytes_saved(value: float | None, saved: float | None) -> str:
    """"1.86 MB (-50%)": the bytes, and what the format saved against float32 where it is
    known (runs with a codec or pruner)."""
    if value is None or not saved or value + saved <= 0:
        return fmt_bytes(value)
    return f"{fmt_bytes(value)} (−{100 * saved / (value + saved):.0f}%)"


def fmt_codecs(push: tuple[str, ...], pull: tuple[str, ...]) -> str:
    """"bf16 / none": the push format(s), then the pull's; "–" for runs that named none."""
    if not push and not pull:
        return "–"
    return f"{', '.join(push) or 'none'} / {', '.join(pull) or 'none'}"


def fmt_score(score: str, value: float | None) -> str:
    return fmt_pct(value) if score == "accuracy" or value is None else f"{value:.4f}"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "–"
    return next(f"{value / 10 ** e:.3g} {u}" for e, u in ((9, "GB"), (6, "MB"), (3, "kB"), (0, "B"))
                if value >= 10 ** e or e == 0)


HEADERS = ["policy", "repeats reaching target", "time to target (s, median)", "min–max (s)",
           "speedup vs BSP", "final acc.", "best acc.", "wait fraction", "mean staleness",
           "samples/s (training)", "push bytes/step", "pull bytes/step", "codec (push / pull)"]


def render_table(rows: list[Row], target: float, score: str = "accuracy",
                 why: dict[tuple[str, str], str] | None = None) -> str:
    """The rows as one HTML table, a header row per scenario; why[(scenario, policy)], if
    given, is a line under that row saying why it failed and what fixes it."""
    why = why or {}
    headers = HEADERS if score == "accuracy" else [
        {"final acc.": "final AUC", "best acc.": "best AUC"}.get(h, h) for h in HEADERS]
    out = ["<table class='tta'>",
           "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr></thead>",
           "<tbody>"]
    scenario = None
    for row in rows:
        if row.scenario != scenario:
            scenario = row.scenario
            out.append(f"<tr class='scenario'><th colspan='{len(HEADERS)}'>scenario "
                       f"{html.escape(scenario)} — target {fmt_target(score, target)}</th></tr>")
        cls = " class='reference'" if row.reference else (
            " class='missed'" if row.tta_median is None else "")
        out.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(row))
                   + "</tr>")
        note = why.get((row.scenario, row.policy))
        if note:
            out.append(f"<tr class='why'><td colspan='{len(HEADERS)}'>↳ {html.escape(note)}"
                       "</td></tr>")
    out.append("</tbody></table>")
    return "\n".join(out)
