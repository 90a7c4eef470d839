"""Straggler attribution: which worker (its host and link where known) cost each run how much
time, chronic or transient. A report section and attribution.csv beside results.csv.

The figures are observe/core/stats.py's, over the run's whole metrics.jsonl: the seconds the other
workers lost waiting for each worker (round mode: its lateness at the end of each round it
closed; arrival mode: the waits charged to it as the one furthest behind), split by the worker's
slow state when the time was lost. Simulated runs without step lines have no attribution.
"""

from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from paramserver.observe.core.stats import CHRONIC, OK, TRANSIENT, JobStats, round_mode_of
from paramserver.report.collect import Collection, Run
from paramserver.spec.run_job import RunJob

COLUMNS = ("scenario", "policy", "repeat", "worker", "host", "link", "lost_s", "chronic_s",
           "transient_s", "normal_s", "share", "state", "chronic_steps", "mean_factor",
           "run_folder")
# Rows per scenario and policy in the report (the CSV has every worker).
SHOWN = 5


@dataclass(frozen=True)
class Blame:
    """One worker of one run."""

    scenario: str
    policy: str
    repeat: int
    worker: int
    host: str  # "" where the run does not say
    link: str  # its --link and/or its preflight probe, "" where neither is known
    lost_s: float  # seconds the other workers lost waiting for it
    chronic_s: float  # of which while it was flagged chronic
    transient_s: float  # ... transient
    normal_s: float  # ... neither (a worker last by a small margin)
    share: float  # lost_s over all the run's lost seconds
    state: str  # its flag at the end of the run
    chronic_steps: int  # its steps while flagged chronic
    mean_factor: float | None  # the mean injected straggler factor of its steps, if recorded
    run_folder: str


def _steps(path: Path) -> list[dict]:
    records = []
    try:
        with open(path) as f:
            for line in f:
                if '"step"' not in line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("kind") == "step":
                    records.append(rec)
    except OSError:
        return []
    return records


def _links(run: Run) -> dict[int, str]:
    """Worker rank -> what is known of its link: the job's --link and the preflight probes."""
    out: dict[int, list[str]] = {}
    try:
        links = RunJob.of(json.loads((run.path / "job.json").read_text())).links
        table = (links.get("w") if isinstance(links, dict) else None) or {}
    except (OSError, ValueError, AttributeError):
        table = {}
    try:
        pre = json.loads((run.path / "preflight.json").read_text())
        links = pre.get("links") or [] if isinstance(pre, dict) else []
    except (OSError, ValueError):
        links = []
    workers = int(run.summary.get("workers") or 0)
    for w in range(workers):
        text = table.get(str(w), table.get("*"))
        if text:
            out.setdefault(w, []).append(f"--link {text}")
    for item in links:
        try:
            w = int(str(item["worker"]).rsplit("-", 1)[-1])
            out.setdefault(w, []).append(f"s{int(item['shard'])}: {float(item['rtt_ms']):.2f} ms "
                                         f"{float(item['mbit_s']):.0f} Mbit/s")
        except (KeyError, TypeError, ValueError):
            continue
    return {w: "; ".join(parts) for w, parts in out.items()}


def _hosts(run: Run) -> dict[int, str]:
    """Worker rank -> host, where the run's events say (a registration with a host field)."""
    out = {}
    try:
        with open(run.path / "events.jsonl") as f:
            for line in f:
                if "worker_registered" not in line:
                    continue
                try:
                    e = json.loads(line)
                    if e.get("host"):
                        out[int(e["rank"])] = str(e["host"])
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return out


def run_blames(run: Run) -> list[Blame]:
    """Every worker of `run` with its attribution, costliest first ([] without step lines)."""
    steps = _steps(run.path / "metrics.jsonl")
    if not steps:
        return []
    stats = JobStats(round_mode_of(run.policy))
    chronic_steps: dict[int, int] = {}
    factors: dict[int, list[float]] = {}
    for rec in sorted(steps, key=lambda r: float(r.get("t") or 0.0)):
        stats.add(rec)
        try:
            w = int(rec["worker"])
        except (KeyError, TypeError, ValueError):
            continue
        if stats.classifier.state.get(w) == CHRONIC:
            chronic_steps[w] = chronic_steps.get(w, 0) + 1
        f = rec.get("factor")
        if isinstance(f, (int, float)):
            factors.setdefault(w, []).append(float(f))
    stats.finish()
    ledger = stats.ledger
    total = sum(ledger.lost.values())
    links, hosts = _links(run), _hosts(run)
    out = []
    for w in sorted(stats.workers):
        by = ledger.lost_by_state.get(w, {})
        lost = ledger.lost.get(w, 0.0)
        fs = factors.get(w)
        out.append(Blame(run.scenario, run.policy, run.repeat, w, hosts.get(w, ""),
                         links.get(w, ""), lost, by.get(CHRONIC, 0.0), by.get(TRANSIENT, 0.0),
                         by.get(OK, 0.0), lost / total if total > 0 else 0.0,
                         stats.classifier.state.get(w, OK), chronic_steps.get(w, 0),
                         sum(fs) / len(fs) if fs else None, str(run.path)))
    return sorted(out, key=lambda b: (-b.lost_s, b.worker))


def blames(c: Collection) -> list[Blame]:
    """Every run's attribution, in report order (scenario, policy, repeat)."""
    out = []
    for scenario in c.scenarios():
        for policy in c.policies(scenario):
            for run in c.select(scenario, policy):
                out.extend(run_blames(run))
    return out


def attribution_csv(rows: list[Blame]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for b in rows:
        row = asdict(b)
        for k in ("lost_s", "chronic_s", "transient_s", "normal_s"):
            row[k] = round(row[k], 4)
        row["share"] = round(row["share"], 4)
        if row["mean_factor"] is not None:
            row["mean_factor"] = round(row["mean_factor"], 4)
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def write_attribution_csv(rows: list[Blame], path: Path) -> Path:
    path.write_text(attribution_csv(rows), encoding="utf-8")
    return path


def attribution_section(rows: list[Blame]) -> str:
    """The report's section: per scenario and policy, the workers others waited for most
    (summed over repeats), with the split chronic / transient / neither."""
    if not rows:
        return ""
    groups: dict[tuple[str, str], dict[int, list[Blame]]] = {}
    for b in rows:
        groups.setdefault((b.scenario, b.policy), {}).setdefault(b.worker, []).append(b)
    e = html.escape
    out = ["<h2>Who the others waited for</h2><p>Per scenario and policy, the seconds the "
           "other workers lost waiting for each worker, summed over repeats (round mode: how "
           "late it closed each round, times the workers waiting; arrival mode: the waits a "
           "policy's bound imposed while it was furthest behind), split by its flag then: "
           "<b>chronic</b> (slow in most of its recent steps), <b>transient</b> (a burst), or "
           "neither; the workers others lost most to first. Every worker of every run is a "
           "row of <a href='attribution.csv'>attribution.csv</a>.</p>"]
    for (scenario, policy), workers in groups.items():
        total = sum(b.lost_s for bs in workers.values() for b in bs)
        ranked = sorted(workers.items(), key=lambda kv: -sum(b.lost_s for b in kv[1]))
        ranked = [(w, bs) for w, bs in ranked if sum(b.lost_s for b in bs) > 0][:SHOWN]
        out.append(f"<h3>{e(scenario)}: {e(policy)}</h3>")
        if not ranked:
            out.append("<p>Nobody waited for anybody.</p>")
            continue
        # Host and link say something where workers ran on several hosts or behind emulated
        # links; on one host without --link they would be dashes and a loopback probe.
        hosts = {b.host for _, bs in ranked for b in bs if b.host}
        show_link = any("--link" in b.link for _, bs in ranked for b in bs) or len(hosts) > 1
        out.append("<table><tr><th>worker</th>" + ("<th>host</th>" if hosts else "")
                   + ("<th>link</th>" if show_link else "") + "<th>others lost s</th>"
                   "<th>share</th><th>chronic s</th><th>transient s</th><th>neither s</th>"
                   "<th>flag at end</th><th>mean injected factor</th></tr>")
        for w, bs in ranked:
            lost = sum(b.lost_s for b in bs)
            factors = [b.mean_factor for b in bs if b.mean_factor is not None]
            factor = f"{sum(factors) / len(factors):.2f}" if factors else "-"
            states = ", ".join(sorted({b.state for b in bs}))
            host = " / ".join(sorted({b.host for b in bs if b.host})) or "-"
            link = " / ".join(sorted({b.link for b in bs if b.link})) or "-"
            out.append(
                f"<tr><td>{w}</td>" + (f"<td>{e(host)}</td>" if hosts else "")
                + (f"<td>{e(link)}</td>" if show_link else "")
                + f"<td>{lost:.1f}</td><td>{lost / total:.0%}</td>"
                f"<td>{sum(b.chronic_s for b in bs):.1f}</td>"
                f"<td>{sum(b.transient_s for b in bs):.1f}</td>"
                f"<td>{sum(b.normal_s for b in bs):.1f}</td><td>{e(states)}</td>"
                f"<td>{factor}</td></tr>")
        out.append("</table>")
    return "\n".join(out)
