"""`paramserver report DIR`: the comparison report (report.html + figures) from run folders."""

from __future__ import annotations

import sys

from paramserver.cli import args as flag


# The one-line help of each command here (cli.main lists them without building parsers).
SUMMARY = {"report": "write report.html and figures from run folders"}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help=SUMMARY["report"],
        description="Read the run folders under DIR (a `paramserver compare` folder, a folder of "
                    "run folders, or one run folder) and write DIR/report.html, a self-contained "
                    "page with the verdict, the time-to-accuracy table and figures, plus "
                    "DIR/figures/*.png, DIR/results.csv (one row per run), DIR/attribution.csv "
                    "(per worker of each run: the time the others lost waiting for it) and "
                    "DIR/verdict.txt (the page's verdict in plain words).")
    p.add_argument("dir", metavar="DIR", help="folder with the runs")
    p.add_argument("--target", type=flag.accuracy, metavar="ACC",
                   help="target test accuracy, e.g. 0.9, or test AUC for click models (default: "
                        "the plan's, else 0.95; AUC 0.7)")
    p.set_defaults(func=run)


def run(args) -> int:
    # Imported here so `paramserver --help` does not pay for matplotlib.
    from paramserver.report import ReportError, build_report
    try:
        page = build_report(args.dir, target=args.target)
    except ReportError as exc:
        print(f"paramserver report: {exc}", file=sys.stderr)
        return 2
    print(page)
    return 0
