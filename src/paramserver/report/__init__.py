"""Comparison reports from run folders: table, figures and a self-contained report.html."""

from __future__ import annotations

from pathlib import Path

from paramserver.report.attribution import blames, write_attribution_csv
from paramserver.report.collect import Collection, ReportError, Run, collect
from paramserver.report.figures import draw_all
from paramserver.report.html import chance_level, diagnoses, render_report, verdict_texts
from paramserver.report.results_csv import write_results_csv
from paramserver.report.table import Row, table_rows


RESULTS_CSV = "results.csv"  # one row per run, beside report.html
ATTRIBUTION_CSV = "attribution.csv"  # one row per worker of each run: who cost how much time
VERDICT_TXT = "verdict.txt"  # the page's verdict in plain words, a paragraph per scenario


def build_report(directory: str | Path, target: float | None = None) -> Path:
    """Write DIR/report.html, DIR/results.csv, DIR/attribution.csv, DIR/verdict.txt and
    DIR/figures/*.png from the runs under DIR; returns the page."""
    directory = Path(directory)
    c = collect(directory)
    if target is not None:
        # An explicit target overrides the plan's; the plan itself is left untouched on disk.
        c.plan = {**(c.plan or {}), "target_accuracy": target}
    rows = table_rows(c)
    figures = draw_all(c, rows, directory / "figures")
    page = directory / "report.html"
    blamed = blames(c)
    why = diagnoses(c, rows)  # the page's and verdict.txt's
    page.write_text(render_report(c, rows, figures, blamed, why), encoding="utf-8")
    write_results_csv(c, directory / RESULTS_CSV, chance_level(c))
    write_attribution_csv(blamed, directory / ATTRIBUTION_CSV)
    (directory / VERDICT_TXT).write_text("\n\n".join(verdict_texts(c, rows, why)) + "\n",
                                         encoding="utf-8")
    return page


__all__ = ["RESULTS_CSV", "Collection", "ReportError", "Row", "Run", "build_report", "collect",
           "table_rows", "ATTRIBUTION_CSV", "VERDICT_TXT"]
