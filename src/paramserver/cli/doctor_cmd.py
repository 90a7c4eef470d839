"""`paramserver doctor RUN`: the stall reports a job's coordinator wrote (RUN/stall-<n>.txt),
the latest printed in full and the others listed."""

from __future__ import annotations

import sys
from pathlib import Path

from paramserver.runlog.folders import runs_hint

SUMMARY = {"doctor": "print a run's latest stall report: who the job waited on, and where"}

STACKS = "== stacks and flight recorders =="


def stall_reports(run: Path) -> list[Path]:
    """The run folder's stall reports, oldest (lowest number) first."""
    found = []
    for p in run.glob("stall-*.txt"):
        number = p.stem.removeprefix("stall-")
        if number.isdigit():
            found.append((int(number), p))
    return [p for _, p in sorted(found)]


def _run(args) -> int:
    from paramserver.observe.core.stall import headline
    run = Path(args.run)
    if not run.is_dir():
        print(f"paramserver doctor: no run folder at {run}", file=sys.stderr)
        return 2
    reports = stall_reports(run)
    if not reports and not any((run / f).is_file() for f in ("metrics.jsonl", "events.jsonl")):
        print(f"paramserver doctor: {run} is no run folder (no metrics.jsonl or events.jsonl)"
              + (runs_hint(run) or "; give the folder a train, launch or serve wrote"),
              file=sys.stderr)
        return 2
    if not reports:
        print(f"paramserver doctor: no stall reports in {run}: no step went missing for the "
              f"stall timeout while it ran (or the job is older than stall reports)",
              file=sys.stderr)
        return 1
    chosen = reports[-1]
    if args.report is not None:
        chosen = run / f"stall-{args.report}.txt"
        if chosen not in reports:
            names = ", ".join(p.stem.removeprefix("stall-") for p in reports)
            print(f"paramserver doctor: {run} has no stall report {args.report} (it has "
                  f"{names})", file=sys.stderr)
            return 2
    texts = {p: p.read_text(errors="replace") for p in reports}
    print(f"{len(reports)} stall report(s) in {run}:")
    for p in reports:
        mark = "*" if p == chosen else " "
        print(f" {mark} {p.name}: {headline(texts[p])}")
    if args.list:
        return 0
    text = texts[chosen]
    if args.brief:
        text = text.split(STACKS)[0].rstrip() + f"\n({STACKS[3:-3]}: left out, --brief)\n"
    print(f"\n{chosen}:\n")
    print(text, end="")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "doctor", help=SUMMARY["doctor"],
        description="Print the latest stall report of a run folder (and list the others). "
                    "The coordinator writes RUN/stall-<n>.txt when no step completes for the "
                    "stall timeout (--stall-timeout; default 10 x the median step time, at "
                    "least min(3 s, heartbeat timeout / 2)), or when one worker clocks no step for that long while the "
                    "others step on: the missing workers, what every member says it waits for "
                    "(op, step, key range, peer), and each live member's stack (faulthandler) "
                    "and last protocol events. A member that did not answer (stopped, hung "
                    "outside Python, gone) is named from the coordinator's view.")
    p.add_argument("run", metavar="RUN", help="a run folder (train, launch, compare cell)")
    p.add_argument("--report", type=int, metavar="N", help="print stall-N.txt, not the latest")
    p.add_argument("--list", action="store_true", help="only list the reports")
    p.add_argument("--brief", action="store_true",
                   help="leave out the stacks and flight recorders")
    p.set_defaults(func=_run)
