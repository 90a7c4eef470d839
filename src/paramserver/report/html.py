"""report.html: one self-contained page (inline CSS, PNGs as data URIs) that opens offline."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from statistics import median

from paramserver.report.attribution import attribution_section, blames
from paramserver.report.collect import SINGLE, Collection, Run, fmt_target
from paramserver.report.core.diagnose import (Diagnosis, RunOutcome, Setting, budget_flag,
                                               diagnose)
from paramserver.report.figures import FigureFile
from paramserver.report.table import Row, fmt_pct, fmt_score, render_table
from paramserver.report.verdict import verdicts

# The figure that opens the page beside the verdict; the figures section leaves it out so it
# is embedded once.
TOP_FIGURE = "tta"

CAPTIONS = {
    "accuracy_time": "Test accuracy against wall time. Read the horizontal distance between "
                     "lines at the dotted target: that is the time a policy saves or loses. Thin "
                     "lines are single repeats, thick lines their median; the dashed grey line is "
                     "one worker doing the same global batch.",
    "accuracy_steps": "Test accuracy against steps (samples processed / global batch). This "
                      "removes speed: a policy below BSP here loses accuracy per sample to stale "
                      "or smaller updates; one that only wins in the wall-time figure wins by "
                      "waiting less.",
    "breakdown": "Seconds each worker spent computing, communicating (pull + push) and waiting "
                 "for a release, averaged over repeats. Tall yellow parts on the fast workers "
                 "mean they idle for a straggler; a policy that shrinks them uses the cluster "
                 "better.",
    "staleness": "How many updates the servers applied between a worker's pull and its push. "
                 "BSP is all zero; mass to the right means gradients computed on older "
                 "parameters, which costs accuracy per step.",
    "wait_bands": "Simulations only: each worker's wait before a step, across workers, step by "
                  "step (line: median; band: 10th to 90th percentile). A band that widens "
                  "means a few workers wait much longer than the rest.",
    "throughput": "Samples processed per second of training by all workers together, up to the "
                  "last step (bar: median, dots: repeats). Higher means less idle time, not "
                  "necessarily faster learning: compare with the step figure above.",
    "tta": "Seconds until the test accuracy first reached the target: bar is the median over "
           "repeats, the whisker spans min to max, the label gives the speedup over BSP "
           "(median BSP time / median policy time). This is the number to compare.",
}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1.5em;color:#222;line-height:1.45}
h1{margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
.sub{color:#666}table{border-collapse:collapse;margin:.8em 0;font-size:.92em;display:block;
max-width:100%;overflow-x:auto}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
table.tta td{white-space:nowrap}
table.tta td:not(:first-child),table.share td{text-align:right}
tr.scenario th{background:#eef2f8}tr.reference td{color:#555;font-style:italic}
tr.missed td{background:#fff4f4}
table.tta tr.why td{white-space:normal;text-align:left;color:#8a3b00;font-size:.95em}
.warn li{color:#8a3b00}
figure{margin:1.2em 0 2em}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#444;max-width:62em;font-size:.95em}code{background:#f4f4f4;padding:0 .2em}
p.verdict{font-size:1.08em;max-width:62em}details.settings summary{cursor:pointer;font-size:1.2em;
font-weight:bold;margin-top:2em}
"""


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _e(value) -> str:
    return html.escape(str(value))


def _kv_table(items) -> str:
    return ("<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in items)
            + "</table>")


def plan_section(c: Collection) -> str:
    """What was run: the compare plan, or the settings the runs themselves recorded."""
    # Folded: the settings say how the answer was reached, not what it is.
    out = ["<details class='settings'><summary>Plan and settings</summary>"]
    plan = c.plan or {}
    if plan.get("scenarios"):
        out.append("<table><tr><th>scenario</th><th>straggler</th><th>description</th></tr>")
        for name, s in plan["scenarios"].items():
            s = s if isinstance(s, dict) else {}
            out.append(f"<tr><td>{_e(name)}</td><td><code>{_e(s.get('straggler', ''))}</code>"
                       f"</td><td>{_e(s.get('description', ''))}</td></tr>")
        out.append("</table>")
    out.append(_kv_table([
        ("policies", ", ".join(c.policies()) + ("" if SINGLE not in c.policies() else
                                                "  (single = one worker, same global batch)")),
        ("repeats", plan.get("repeats", _max_repeats(c))),
        ("target", fmt_target(c.score, c.target)), ("runs read", len(c.runs))]))
    config = dict(plan.get("config") or _recorded_settings(c))
    if plan.get("config"):
        # The plan's config is the template; these two are set per run by policy and scenario.
        for key in ("sync", "straggler"):
            config.pop(key, None)
    paired = plan.get("policy_optimizers") or {}
    if paired and "optimizer" in config:
        # compare's default pairing: the template's rule is not every run's
        config["optimizer"] = f"{config['optimizer']}; " + ", ".join(
            f"{rule} for {policy}" for policy, rule in paired.items())
    if config:
        out.append("<p>Training settings shared by every run:</p>")
        out.append(_kv_table((k, "–" if v is None else json.dumps(v) if isinstance(
            v, (dict, list)) else v) for k, v in config.items()))
    out.append("</details>")
    return "\n".join(out)


def _max_repeats(c: Collection) -> int:
    return max(r.repeat for r in c.runs) + 1


def _recorded_settings(c: Collection) -> dict:
    keys = ("workers", "servers", "model", "dataset", "optimizer", "lr", "batch_size",
            "straggler", "device_time")
    out = {}
    for key in keys:
        values = sorted({str(r.summary.get(key)) for r in c.runs if r.policy != SINGLE})
        out[key] = values[0] if len(values) == 1 else "varies: " + ", ".join(values)
    return out


def notes_section(c: Collection) -> str:
    notes = (c.plan or {}).get("notes") or []
    notes = [notes] if isinstance(notes, str) else notes
    if not notes:
        return ""
    return "<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"


def warnings_section(c: Collection, rows: list[Row]) -> str:
    """Skipped runs, recomputed summaries, and every run that never reached the target."""
    items = list(c.warnings)
    unmeasured = [r for r in c.runs if not r.evals]
    if unmeasured:
        items.append(f"{len(unmeasured)} of {len(c.runs)} run(s) have no test evaluation (a "
                     "simulation without --train, or a job without an evaluator): they give "
                     "throughput and waits, not a time to target")
    items += [f"{r.path}: {r.policy} in {r.scenario} (repeat {r.repeat}) never reached "
              f"{fmt_target(c.score, c.target)} (best "
              f"{fmt_score(c.score, r.summary.get(f'best_test_{c.score}'))})"
              for r in c.runs if r.evals and r.time_to(c.target) is None]
    items += [f"{r.path}: {r.policy} in {r.scenario} (repeat {r.repeat}) diverged: its test "
              f"loss is not a finite number from {r.summary['diverged_at_s']:.1f} s on, so its "
              f"final accuracy is chance. A smaller --lr, or --optimizer dynsgd for the "
              f"asynchronous policies, keeps it stable"
              for r in c.runs if r.summary.get("diverged_at_s") is not None]
    items += coverage_warnings(c)
    if rows and not any(r.policy == "bsp" for r in rows):
        items.append("no BSP runs: speedups cannot be computed")
    if not items:
        return "<h2>Warnings</h2><p>None: every run was read and reached the target.</p>"
    return ("<h2>Warnings</h2><ul class='warn'>" + "".join(f"<li>{_e(i)}</li>" for i in items)
            + "</ul>")


def coverage_warnings(c: Collection) -> list[str]:
    """Policies whose accuracy was hardly sampled while they trained: their time to target is
    then the evaluator's timing, not the policy's."""
    out = []
    for scenario in c.scenarios():
        for policy in c.policies(scenario):
            runs = c.select(scenario, policy)
            if not any(r.evals for r in runs):  # nothing measured: said once, above
                continue
            during = median(r.evals_in_training for r in runs)
            lag = median(r.eval_lag for r in runs)
            train = median(r.train_time for r in runs)
            if during < 3 or lag > max(1.0, 0.25 * train):
                out.append(f"{policy} in {scenario}: {during:g} evaluation(s) during training "
                           f"and the last one {lag:.1f} s after the last step (medians; training "
                           f"took {train:.1f} s): its accuracy curve is coarse and its time to "
                           "target partly measures the evaluator, not the policy")
    return out


def timeline_section(c: Collection) -> str:
    """Each run's membership changes (workers joining, leaving, preempted; the job waiting
    below its minimum; servers lost and restored) and, under auto, the policy in force, in
    training seconds; nothing when no run had any."""
    runs = [r for r in c.runs if r.timeline]
    if not runs:
        return ""
    out = ["<h2>Membership timeline</h2><p>Who joined, left or was lost, which policy "
           "<code>auto</code> put in force and why, and when (seconds of training, from "
           "<code>events.jsonl</code>).</p>"]
    for run in runs:
        out.append(f"<h3>{_e(run.scenario)} / {_e(run.policy)} (repeat {run.repeat})</h3>")
        out.append("<table><tr><th>t (s)</th><th>change</th></tr>" + "".join(
            f"<tr><td>{row.t:.1f}</td><td>{_e(row.text)}</td></tr>" for row in run.timeline)
            + "</table>")
    return "\n".join(out)


def fidelity_section(rows: list[Row]) -> str:
    """How much of the modelled compute time was real computation rather than emulated sleep."""
    policies = list(dict.fromkeys(r.policy for r in rows))
    share = {(r.scenario, r.policy): fmt_pct(r.real_compute_share) for r in rows}
    head = "".join(f"<th>{_e(p)}</th>" for p in policies)
    body = "".join(f"<tr><th>{_e(s)}</th>" + "".join(
        f"<td>{share.get((s, p), '')}</td>" for p in policies) + "</tr>"
        for s in dict.fromkeys(r.scenario for r in rows))
    return ("<h2>Real-compute share</h2><p>Real forward + backward time divided by the modelled "
            "compute time (median over repeats). 100% means every second of compute was real "
            "work; with emulated device time (<code>--device-time</code>) or a straggler factor "
            "the rest was slept, so timing differences come from the model of the device, not "
            "from PyTorch. Low shares are fine for comparing policies; they are not a "
            "measurement of the real hardware. Simulated runs compute nothing for real: 0%.</p>"
            f"<table class='share'><tr><th>scenario</th>{head}</tr>{body}</table>")


def _anchor(scenario: str) -> str:
    return "scenario-" + "".join(ch if ch.isalnum() else "-" for ch in scenario)


def figures_section(c: Collection, figures: list[FigureFile]) -> str:
    out = ["<h2>Figures</h2><p>Per scenario: " + ", ".join(
        f"<a href='#{_anchor(s)}'>{_e(s)}</a>" for s in c.scenarios()) + "</p>"]
    for scenario in c.scenarios():
        out.append(f"<h3 id='{_anchor(scenario)}'>Scenario {_e(scenario)}</h3>")
        out += [_figure(f) for f in figures if f.scenario == scenario and f.kind != TOP_FIGURE]
    return "\n".join(out)


def _figure(f: FigureFile) -> str:
    return (f"<figure><img alt='{_e(f.kind)} {_e(f.scenario)}' src='{data_uri(f.path)}'>"
            f"<figcaption>{_e(CAPTIONS[f.kind])}</figcaption></figure>")


def diverged_times(c: Collection) -> dict[tuple[str, str], list[float]]:
    """(scenario, policy) -> when each diverged repeat's test loss stopped being finite."""
    out: dict[tuple[str, str], list[float]] = {}
    for r in c.runs:
        if r.summary.get("diverged_at_s") is not None:
            out.setdefault((r.scenario, r.policy), []).append(float(r.summary["diverged_at_s"]))
    return out


# Chance accuracy of the built-in data sets (1 / classes); a click model is scored by AUC,
# whose chance is 0.5.
CHANCE = {"digits": 0.1, "mnist": 0.1}


def chance_level(c: Collection) -> float | None:
    """The score a model that learned nothing gets, when the runs say what it is."""
    if c.score == "auc":
        return 0.5
    values = {_chance(r) for r in c.runs}
    return values.pop() if len(values) == 1 else None


def _config(run: Run) -> dict:
    """The run's settings (config.json's `config`); {} where unreadable."""
    try:
        config = json.loads((run.path / "config.json").read_text()).get("config") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return config if isinstance(config, dict) else {}


def _chance(run: Run) -> float | None:
    dataset = run.summary.get("dataset")
    if dataset == "synthetic":
        try:
            return 1 / int((_config(run).get("dataset_options") or {}).get("classes", 10))
        except (ValueError, AttributeError, TypeError, ZeroDivisionError):
            return None
    return CHANCE.get(dataset)


def diagnoses(c: Collection, rows: list[Row]) -> dict[tuple[str, str], Diagnosis]:
    """(scenario, policy) -> the failure of its repeats, with cause and fix; only rows that
    failed somewhere appear."""
    chance = chance_level(c)
    out = {}
    for row in rows:
        runs = c.select(row.scenario, row.policy)
        first = runs[0].summary
        setting = Setting(policy=str(first.get("sync") if row.reference else row.policy),
                          optimizer=str(first.get("optimizer") or "sgd"),
                          lr=first.get("lr"), workers=first.get("workers"),
                          straggler=str(first.get("straggler") or "none"),
                          staleness=row.staleness, budget=budget_flag(_config(runs[0])))
        outcomes = [RunOutcome(reached=r.time_to(c.target) is not None,
                               final=r.summary.get(f"final_test_{c.score}"),
                               best=r.summary.get(f"best_test_{c.score}"),
                               diverged_at=r.summary.get("diverged_at_s")) for r in runs
                    if r.evals or r.summary.get("diverged_at_s") is not None]
        if not outcomes:  # no accuracy was measured: there is no failure to explain
            continue
        found = diagnose(setting, outcomes, chance, c.score)
        if found is not None:
            out[(row.scenario, row.policy)] = found
    return out


# Where a user goes from here: this comparison's cluster is emulated on one machine.
ADVISE_LINE = ("For your own cluster: `paramserver advise --profile RUN_DIR` fits a model of "
               "it from one of your runs (or a short live run) and ranks the policies at its "
               "scale.")


def verdict_texts(c: Collection, rows: list[Row],
                  why: dict[tuple[str, str], Diagnosis] | None = None) -> list[str]:
    """The verdict in words, a paragraph per scenario: the page's opening, and what compare
    prints when it ends."""
    why = diagnoses(c, rows) if why is None else why
    return [v.text for v in verdicts(rows, c.target, c.score, diverged_times(c), why)]


def verdict_section(c: Collection, rows: list[Row], figures: list[FigureFile],
                    why: dict[tuple[str, str], Diagnosis] | None = None) -> str:
    """The answer first: a verdict paragraph per scenario, then its time-to-target figure."""
    out = ["<h2>Verdict</h2>"]
    for v in verdicts(rows, c.target, c.score, diverged_times(c), why):
        out.append(f"<p class='verdict'>{_e(v.text)}</p>")
        out += [_figure(f) for f in figures if f.scenario == v.scenario and f.kind == TOP_FIGURE]
    out.append(f"<p class='advise'>{_e(ADVISE_LINE)}</p>")
    return "\n".join(out)


def render_report(c: Collection, rows: list[Row], figures: list[FigureFile],
                  blamed: list | None = None,
                  why: dict[tuple[str, str], Diagnosis] | None = None) -> str:
    """The whole page as one string; `blamed`: the runs' straggler attribution
    (report/attribution.py), and `why`: the diagnoses of the policies that missed, each worked
    out here when not given."""
    why = diagnoses(c, rows) if why is None else why
    if blamed is None:
        blamed = blames(c)
    body = [f"<h1>Synchronization policies compared</h1><p class='sub'>{len(c.runs)} runs from "
            f"<code>{_e(c.root)}</code>; everything below is drawn from their log files, and "
            "every run is a row of <a href='results.csv'>results.csv</a> beside this page.</p>",
            # Reading order: the answer, the numbers behind it, then how it was obtained.
            verdict_section(c, rows, figures, why),
            f"<h2>Time to {fmt_target(c.score, c.target)} and wait per policy</h2>",
            "<p>Median and min–max over repeats; a repeat that never reached the target counts "
            "as slower than any that did. Speedup = median BSP time / median policy time. "
            "Accuracies are medians, wait fraction and staleness means over repeats.</p>",
            render_table(rows, c.target, c.score,
                         {k: d.line(k[1]) for k, d in why.items()}),
            warnings_section(c, rows), attribution_section(blamed), notes_section(c),
            timeline_section(c),
            fidelity_section(rows), figures_section(c, figures), plan_section(c)]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<title>paramserver report</title><style>" + _CSS + "</style></head><body>\n"
            + "\n".join(b for b in body if b) + "\n</body></html>\n")
