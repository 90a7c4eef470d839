"""What `paramserver calibrate` does once the live grid has run: read the runs, fit the
convergence model, simulate each cell, predict leave-one-out, and write calibration.json,
calibration.csv and calibration.html. The arithmetic is validate.py's (pure); this module does
the I/O: run folders, the simulator's runs, the output files.

A cell is predicted as `paramserver advise` predicts: a cluster model fitted from a profile
(advise.core.cluster.fit of a live run folder) drives advise.core.outcome.simulate_policy at
the cell's scale, and the convergence model turns the simulated staleness and update batch into
samples to target, read off the simulated samples-time curve. Leave-one-out on both sides: the
profiles are the runs of the other policies in the cell's setting (as a user profiles the
job once and asks about every policy), and the convergence model is fitted without the cell.
"""

from __future__ import annotations

import csv
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from paramserver.advise.calibration_io import RunFolder, find_runs
from paramserver.predict.convergence import Band, ConvergenceModel
from paramserver.advise.core.fit_convergence import LiveRun, fit, live_run
from paramserver.advise.core.validate import (GOAL, Cell, CellResult, Claim, PolicyVerdict,
                                         leave_out, measure, per_policy, seed_claims)

@dataclass
class Calibration:
    model: ConvergenceModel
    results: list[CellResult]
    verdicts: list[PolicyVerdict]
    claims: list[Claim]
    meta: dict
    runs: list[LiveRun] = field(default_factory=list)


def _apply_mode(policy: str) -> str:
    from paramserver.policies import SYNC_POLICIES
    return SYNC_POLICIES.get(base_policy(policy)).apply_mode


RULE_SEP = "+"


def model_key(policy: str, rule: str | None) -> str:
    """The convergence model's name for a policy run with update rule `rule`: the bare policy
    for the rule compare pairs it with (the candidates advise ranks: SSP and DSSP with
    dynsgd, the others with sgd), POLICY+RULE otherwise, so runs of one policy under two
    update rules (SSP with sgd never reaches 95%, with dynsgd it does) never pool."""
    from paramserver.policies import SYNC_POLICIES
    from paramserver.spec.job import OptimizerSpec
    paired = (SYNC_POLICIES.get(policy).paired_rule if policy in SYNC_POLICIES else None) \
        or OptimizerSpec.name
    return policy if rule is None or rule == paired else f"{policy}{RULE_SEP}{rule}"


def base_policy(key: str) -> str:
    return key.split(RULE_SEP, 1)[0]


def _key_of(run: RunFolder) -> str:
    return model_key(run.policy, run.config.get("optimizer"))


def _cell_of(run: RunFolder) -> Cell:
    return Cell(_key_of(run), run.scenario, run.link, run.job.workers)


def _to_live(run: RunFolder, target: float) -> LiveRun:
    cell = _cell_of(run)
    return live_run(cell.policy, _apply_mode(cell.policy), cell.setting, run.repeat,
                    run.summary, run.evals, target)


def _predict_outcomes(cell: Cell, profiles: list[RunFolder], clusters: dict) -> list:
    """advise's outcome of the cell's policy on the cluster fitted from each profile run."""
    from paramserver.advise.core.cluster import fit as fit_cluster
    from paramserver.advise.core.outcome import simulate_policy
    from paramserver.advise.profile import load_profile
    out = []
    for pf in profiles:
        if pf.folder not in clusters:
            clusters[pf.folder] = fit_cluster(load_profile(pf.folder))
        job = pf.job
        policy = base_policy(cell.policy)
        options = dict(job.sync_options) if job.sync == policy else {}
        out.append(simulate_policy(clusters[pf.folder].at(job.workers), policy,
                                   options, samples=job.max_samples,
                                   seed=pf.config.get("seed", 0)))
    return out


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def calibrate(source: Path, out: Path, target: float, console=None,
              meta: dict | None = None) -> Calibration:
    say = console.print if console is not None else (lambda *a: None)
    folders = find_runs(source)
    if not folders:
        raise ValueError(f"no finished runs under {source}")
    runs = [_to_live(r, target) for r in folders]
    model = fit(runs, target, source=dict(meta or {}, runs=len(runs)))
    cells: dict[Cell, list[RunFolder]] = {}
    for r in folders:
        cells.setdefault(_cell_of(r), []).append(r)
    say(f"predicting {len(cells)} cells through advise's cluster fit and simulator ...")
    clusters: dict = {}
    results = []
    for cell, rs in cells.items():
        profiles = [r for r in folders
                    if _cell_of(r).setting == cell.setting
                    and base_policy(_cell_of(r).policy) != base_policy(cell.policy)]
        outcomes = _predict_outcomes(cell, profiles, clusters)
        mine = [r for r in runs if r.policy == cell.policy and r.cell == cell.setting]
        loo = leave_out(runs, cell)
        if not outcomes or not loo:
            results.append(CellResult(cell, measure(mine), None, None, math.nan, math.nan, 0))
            continue
        staleness = _median([o.mean_staleness for o in outcomes])
        update_batch = _median([o.update_batch for o in outcomes])
        need = fit(loo, target).samples_needed(cell.policy, apply_mode=_apply_mode(cell.policy),
                                               update_batch=update_batch,
                                               staleness=staleness)
        predicted = None
        if need is not None:
            predicted = Band(*(_median([o.time_to(n) for o in outcomes])
                               for n in (need.lo, need.mid, need.hi)))
        measured = measure(mine)
        at_live = None if measured.samples is None else _median(
            [o.time_to(measured.samples) for o in outcomes])
        results.append(CellResult(cell, measured, predicted, need, staleness,
                                  update_batch, len(outcomes), at_live))
    return Calibration(model, results, per_policy(results), seed_claims(results),
                       dict(meta or {}), runs)


def _slug(cell: Cell) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in cell.key)


def to_json(cal: Calibration) -> dict:
    return {"version": 1, "kind": "paramserver calibration", **cal.meta,
            "goal": GOAL, "convergence": cal.model.to_json(),
            "cells": [{"policy": r.cell.policy, "scenario": r.cell.scenario,
                       "link": r.cell.link, "workers": r.cell.workers,
                       "runs": r.measured.runs,
                       "reached": r.measured.reached, "measured_s": r.measured.median_s,
                       "measured_lo_s": r.measured.lo_s, "measured_hi_s": r.measured.hi_s,
                       "predicted_s": r.predicted.mid if r.predicted else None,
                       "predicted_lo_s": r.predicted.lo if r.predicted else None,
                       "predicted_hi_s": _finite(r.predicted.hi) if r.predicted else None,
                       "error": r.error, "within_goal": r.agrees,
                       "measured_samples": r.measured.samples,
                       "predicted_samples": r.samples.mid if r.samples else None,
                       "samples_error": r.samples_error,
                       "sim_s_at_measured_samples": r.sim_time_at_live_samples,
                       "throughput_error": r.throughput_error,
                       "sim_staleness": r.sim_staleness,
                       "sim_update_batch": r.sim_update_batch,
                       "profiles": r.profiles} for r in cal.results],
            "policies": [{"policy": v.policy, "cells": v.cells, "compared": v.compared,
                          "median_abs_error": v.median_abs_error,
                          "max_abs_error": v.max_abs_error, "within_goal": v.within_goal}
                         for v in cal.verdicts],
            "seed_claims": [{"policy": c.policy, "claim": c.claim, "setting": c.setting,
                             "live_speedup": c.live, "simulated_speedup": c.simulated}
                            for c in cal.claims]}


def _finite(x):
    return None if x is None or not math.isfinite(x) else x


CSV_FIELDS = ["policy", "scenario", "link", "workers", "runs", "reached", "measured_s", "measured_lo_s",
              "measured_hi_s", "predicted_s", "predicted_lo_s", "predicted_hi_s", "error",
              "within_goal", "measured_samples", "predicted_samples", "samples_error",
              "sim_s_at_measured_samples", "throughput_error", "sim_staleness",
              "sim_update_batch", "profiles"]


def write_outputs(cal: Calibration, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    doc = to_json(cal)
    paths = {"json": out / "calibration.json", "csv": out / "calibration.csv",
             "html": out / "calibration.html"}
    paths["json"].write_text(json.dumps(doc, indent=2))
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for row in doc["cells"]:
            w.writerow({k: row[k] for k in CSV_FIELDS})
    paths["html"].write_text(render_html(cal, doc))
    return paths


def _fmt_s(x) -> str:
    return "never" if x is None else ("&infin;" if not math.isfinite(x) else f"{x:.2f} s")


def _fmt_pct(x) -> str:
    return "" if x is None else f"{x:+.0%}"


def _fmt_abs(x) -> str:
    return "" if x is None else f"{x:.0%}"


def _fmt_x(x) -> str:
    return "&ndash;" if x is None else f"{x:.2f}x"


def _scatter(results: list[CellResult]) -> str:
    """Predicted against measured seconds, one dot per cell, the 15% corridor shaded."""
    pts = [(r.measured.median_s, r.predicted.mid, r.cell.policy) for r in results
           if r.measured.median_s is not None and r.predicted is not None]
    if not pts:
        return "<p>No cell where both live runs and the prediction reached the target.</p>"
    top = max(max(a, b) for a, b, _ in pts) * 1.15
    size, pad = 360, 40
    sx = lambda v: pad + v / top * (size - 2 * pad)  # noqa: E731
    sy = lambda v: size - pad - v / top * (size - 2 * pad)  # noqa: E731
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
    names = list(dict.fromkeys(p for _, _, p in pts))
    parts = [f'<svg width="{size + 120}" height="{size}" role="img" '
             f'aria-label="predicted against measured time to target">',
             f'<polygon points="{sx(0)},{sy(0)} {sx(top / (1 + GOAL))},{sy(top)} '
             f'{sx(top)},{sy(top)} {sx(top)},{sy(top * (1 - GOAL))}" fill="#eee"/>',
             f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(top)}" y2="{sy(top)}" stroke="#999"/>',
             f'<line x1="{pad}" y1="{size - pad}" x2="{size - pad}" y2="{size - pad}" '
             f'stroke="#000"/><line x1="{pad}" y1="{pad}" x2="{pad}" y2="{size - pad}" '
             f'stroke="#000"/>',
             f'<text x="{size / 2}" y="{size - 8}" text-anchor="middle">live median (s)</text>',
             f'<text x="12" y="{size / 2}" transform="rotate(-90 12 {size / 2})" '
             f'text-anchor="middle">predicted (s)</text>',
             f'<text x="{pad}" y="{size - pad + 14}">0</text>'
             f'<text x="{size - pad}" y="{size - pad + 14}" text-anchor="end">{top:.1f}</text>']
    for a, b, p in pts:
        c = colours[names.index(p) % len(colours)]
        parts.append(f'<circle cx="{sx(a):.1f}" cy="{sy(b):.1f}" r="4" fill="{c}">'
                     f'<title>{html.escape(p)}: live {a:.2f} s, predicted {b:.2f} s</title>'
                     f'</circle>')
    for i, p in enumerate(names):
        c = colours[i % len(colours)]
        parts.append(f'<circle cx="{size + 10}" cy="{pad + 16 * i}" r="4" fill="{c}"/>'
                     f'<text x="{size + 20}" y="{pad + 16 * i + 4}">{html.escape(p)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(cal: Calibration, doc: dict) -> str:
    esc = html.escape
    verdicts = cal.verdicts
    ok = [v.policy for v in verdicts if v.within_goal]
    bad = [v.policy for v in verdicts if not v.within_goal]
    errs = [abs(r.error) for r in cal.results if r.error is not None]
    lead = (f"Predicted time to {cal.model.target:.0%} test accuracy is within "
            f"{GOAL:.0%} of the live median in {sum(r.agrees for r in cal.results)} of "
            f"{len(cal.results)} cells (median error "
            f"{(sorted(errs)[len(errs) // 2] if errs else float('nan')):.0%}); "
            f"policies within the goal in every cell: {', '.join(ok) or 'none'}"
            + (f"; outside it somewhere: {', '.join(bad)}." if bad else "."))
    load = cal.meta.get("load_average") or {}
    load_text = (f"Load average (1, 5, 15 min) before the grid {load.get('before', '?')}, "
                 f"after {load.get('after', '?')}" if "before" in load else
                 str(load.get("note", "load not recorded")).capitalize())
    rows = []
    for r in cal.results:
        m = r.measured
        band = ("" if r.predicted is None else
                f"{_fmt_s(r.predicted.lo)} &ndash; {_fmt_s(r.predicted.hi)}")
        rows.append(
            f"<tr><td>{esc(r.cell.policy)}</td><td>{esc(r.cell.scenario)}</td>"
            f"<td>{esc(r.cell.link)}</td><td>{r.cell.workers or ''}</td>"
            f"<td>{m.reached}/{m.runs}</td>"
            f"<td>{_fmt_s(m.median_s)}</td>"
            f"<td>{_fmt_s(m.lo_s)} &ndash; {_fmt_s(m.hi_s)}</td>"
            f"<td>{_fmt_s(r.predicted.mid if r.predicted else None)}</td>"
            f"<td>{band}</td>"
            f"<td>{_fmt_pct(r.error)}</td><td>{'yes' if r.agrees else 'no'}</td>"
            f"<td>{_fmt_pct(r.samples_error)}</td><td>{_fmt_pct(r.throughput_error)}</td>"
            f"<td>{r.sim_staleness:.2f}</td><td>{r.sim_update_batch:.0f}</td>"
            f"<td>{r.profiles}</td></tr>")
    prow = [f"<tr><td>{esc(v.policy)}</td><td>{v.agree}/{v.cells}</td>"
            f"<td>{_fmt_abs(v.median_abs_error)}</td><td>{_fmt_abs(v.max_abs_error)}</td>"
            f"<td>{'yes' if v.within_goal else 'no'}</td></tr>" for v in verdicts]
    crow = [f"<tr><td>{esc(c.claim)}</td><td>{esc(c.setting)}</td><td>{_fmt_x(c.live)}</td>"
            f"<td>{_fmt_x(c.simulated)}</td></tr>" for c in cal.claims]
    m = cal.model
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>paramserver calibration</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:1em auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}</style></head><body>
<h1>Calibration: the simulator's predictions against live runs</h1>
<p id="verdict"><strong>{esc(lead)}</strong></p>
{_scatter(cal.results)}
<p>Each cell is predicted as <code>paramserver advise</code> predicts: a cluster model fitted
from a profile run drives the simulator, and the convergence model turns its staleness and
update batch into samples to target. Leave-one-out: the profiles are the other policies' runs
in the cell's setting (the prediction is their median), and the convergence model is fitted
without the cell's runs. Live medians are over repeats (a cell where fewer
than half the runs reached the target counts as never); times to target are interpolated
between the evaluations either side of the crossing. {esc(load_text)}, on
{esc(str(load.get('cpus', '?')))} CPUs: these are timings on a shared machine.</p>
<h2>Per policy</h2>
<table><tr><th>policy</th><th>cells within {GOAL:.0%}</th><th>median |error|</th>
<th>max |error|</th><th>all within goal</th></tr>{''.join(prow)}</table>
<h2>Per cell</h2>
<p>The error splits in two: the samples error is the convergence model's samples to target
against the live median's; the throughput error is the simulator's time to the live samples
against the live time (what the cluster model and simulator get wrong).</p>
<table><tr><th>policy</th><th>scenario</th><th>link</th><th>workers</th><th>reached</th><th>live median</th>
<th>live spread</th><th>predicted</th><th>predicted band</th><th>error</th>
<th>within {GOAL:.0%}</th><th>samples error</th><th>throughput error</th>
<th>sim staleness</th><th>sim update batch</th>
<th>profiles</th></tr>{''.join(rows)}</table>
<h2>Seed claims, live and simulated</h2>
<p>BSP's time to target over the policy's (above 1: the policy is sooner).</p>
<table><tr><th>claim</th><th>setting</th><th>live</th><th>simulated</th></tr>
{''.join(crow)}</table>
<details><summary>The fitted convergence model (all runs)</summary>
<p>B_crit {m.b_crit:.0f} samples; alpha (cost per step of staleness) {esc(json.dumps(m.alpha))};
target {m.target}.</p><pre>{esc(json.dumps(doc['convergence'], indent=1))}</pre></details>
<details><summary>How it was made</summary><pre>{esc(json.dumps(
        {k: v for k, v in doc.items() if k not in ('convergence', 'cells', 'policies',
                                                   'seed_claims')}, indent=1))}</pre>
</details></body></html>
"""
