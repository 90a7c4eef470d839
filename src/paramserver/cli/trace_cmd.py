"""`paramserver trace RUN [-o FILE] [--steps A:B] [--max-events N]`: a run as a Chrome trace."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.runlog.folders import runs_hint

SUMMARY = {"trace": "write a run's worker phases and shard applies as a Chrome trace (Perfetto)"}


def _steps(text: str):
    from paramserver.observe.core.trace import parse_steps
    try:
        return parse_steps(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _records(path: Path) -> list[dict]:
    from paramserver.runlog.metrics import read_records
    if not path.is_file():
        return []
    return [r for r in read_records(path) if isinstance(r, dict)]


def _run(args) -> int:
    from paramserver.observe.core.trace import TraceError, TraceOptions, build_trace
    run = Path(args.run)
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        print(f"paramserver trace: {run} is no run folder (no metrics.jsonl){runs_hint(run)}",
              file=sys.stderr)
        return 2
    try:
        trace = build_trace(_records(metrics), _records(run / "events.jsonl"),
                            TraceOptions(args.steps, args.max_events))
    except TraceError as exc:
        print(f"paramserver trace: {exc}", file=sys.stderr)
        return 2
    other = trace["otherData"]
    if not other["step_records"]:
        print(f"paramserver trace: {metrics} holds no step records (a simulated run "
              f"written with --detail summary has none)", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else run / "trace.json"
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    tmp.replace(out)
    sampled = ""
    if other["dropped_phase_events"] or other["dropped_events"]:
        sampled = (f"; sampled to {args.max_events} events: every {other['kept_every_step']}"
                   f" step kept ({other['dropped_phase_events']} phase events dropped), "
                   f"{other['dropped_events']} other events dropped")
    print(f"{len(trace['traceEvents'])} events ({other['step_records']} step records of "
          f"{len(other['workers'])} workers, {len(other['shards'])} shards) in {out}{sampled}"
          f"\nopen it in https://ui.perfetto.dev or chrome://tracing")
    return 0


def register(sub) -> None:
    from paramserver.observe.core.trace import DEFAULT_MAX_EVENTS
    p = sub.add_parser(
        "trace", help=SUMMARY["trace"],
        description="Write a Chrome trace event file (JSON, Trace Event Format) of a run "
                    "folder: per worker its steps' phases (wait, pull, data, compute, push) "
                    "rebuilt from the step records, per shard its apply time, applies, queue "
                    "and busy time per heartbeat as counters, and membership changes, "
                    "checkpoints, pauses and stalls as instant events. Open it in Perfetto "
                    "(https://ui.perfetto.dev) or chrome://tracing. Works on a running job's "
                    "folder too (what is written so far). See docs/metrics.md.")
    p.add_argument("run", metavar="RUN", help="a run folder (train, launch)")
    p.add_argument("-o", "--out", metavar="FILE", type=flag.out_file,
                   help="where to write (default: RUN/trace.json)")
    p.add_argument("--steps", metavar="A:B", type=_steps,
                   help="only steps A <= step < B (A: and :B leave a side open), and the "
                        "events within their time")
    p.add_argument("--max-events", metavar="N", type=int, default=DEFAULT_MAX_EVENTS,
                   help=f"at most N events (default {DEFAULT_MAX_EVENTS}): beyond, every k-th "
                        f"step is kept and an instant 'trace sampled' says what was dropped")
    p.set_defaults(func=_run)
