"""results.csv beside report.html: one row per run, for pandas and spreadsheet users."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from paramserver.report.collect import Collection, Run
from paramserver.report.core.diagnose import RunOutcome, classify

COLUMNS = ("scenario", "policy", "repeat", "time_to_target_s", "target", "score",
           "final_score", "best_score", "reached", "diverged", "outcome", "wait_fraction",
           "mean_staleness", "samples_per_s", "steps", "push_bytes_per_step",
           "pull_bytes_per_step", "push_codec", "pull_codec", "run_folder",
           "push_saved_bytes_per_step", "pull_saved_bytes_per_step")


def result_row(run: Run, target: float, score: str, chance: float | None) -> dict:
    """One run's row: plain numbers (empty where unknown), flags as 0/1, and the outcome that
    report/core/diagnose.py names ('ok', 'diverged', 'chance', 'collapsed', 'plateaued'); bytes per
    worker step and the value formats (codec names) its steps carried."""
    s = run.summary
    tta = run.time_to(target)
    final, best = s.get(f"final_test_{score}"), s.get(f"best_test_{score}")
    diverged = s.get("diverged_at_s") is not None
    outcome = classify(RunOutcome(tta is not None, final, best, s.get("diverged_at_s")), chance)
    return {"scenario": run.scenario, "policy": run.policy, "repeat": run.repeat,
            "time_to_target_s": tta, "target": target, "score": score,
            "final_score": final, "best_score": best, "reached": int(tta is not None),
            "diverged": int(diverged), "outcome": outcome or "ok",
            "wait_fraction": s.get("mean_wait_fraction"),
            "mean_staleness": s.get("mean_staleness"), "samples_per_s": run.samples_per_s,
            "steps": s.get("steps"), "push_bytes_per_step": s.get("push_bytes_per_step"),
            "pull_bytes_per_step": s.get("pull_bytes_per_step"),
            "push_codec": _codecs(s.get("push_codecs")),
            "pull_codec": _codecs(s.get("pull_codecs")), "run_folder": str(run.path),
            # against float32, where a codec or pruner was used (empty for dense runs)
            "push_saved_bytes_per_step": s.get("push_saved_bytes_per_step"),
            "pull_saved_bytes_per_step": s.get("pull_saved_bytes_per_step")}


def _codecs(names) -> str | None:
    """The run's formats joined by ';' (several where workers chose differently: --compress
    auto); empty where its steps named none (older and simulated runs)."""
    return ";".join(str(n) for n in names) if isinstance(names, list) and names else None


def results_csv(c: Collection, chance: float | None = None) -> str:
    """The CSV text: a header, then the runs in report order (scenario, policy, repeat)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for scenario in c.scenarios():
        for policy in c.policies(scenario):
            for run in c.select(scenario, policy):
                row = result_row(run, c.target, c.score, chance)
                writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def write_results_csv(c: Collection, path: Path, chance: float | None = None) -> Path:
    path.write_text(results_csv(c, chance), encoding="utf-8")
    return path
