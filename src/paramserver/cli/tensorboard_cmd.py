"""`paramserver tensorboard RUN [--out DIR]`: a run folder's metrics as TensorBoard event files."""

from __future__ import annotations

import sys
from pathlib import Path

from paramserver.runlog.folders import runs_hint

SUMMARY = {"tensorboard": "convert a run folder's metrics to TensorBoard event files"}


def _run(args) -> int:
    from paramserver.runlog.metrics import read_records
    from paramserver.runlog.tensorboard import (
        TensorBoardMissing, band_scalars, scalars, write_events,
    )
    metrics = Path(args.run) / "metrics.jsonl"
    if not metrics.is_file():
        print(f"paramserver tensorboard: {args.run} is no run folder (no metrics.jsonl)"
              f"{runs_hint(Path(args.run))}", file=sys.stderr)
        return 2
    points = scalars(read_records(metrics))
    stats = Path(args.run) / "steps.npz"  # a simulated run's step bands
    if stats.is_file():
        import numpy as np
        with np.load(stats, allow_pickle=False) as arrays:
            points += band_scalars(arrays)
    if not points:
        print(f"paramserver tensorboard: {metrics} holds no step or eval records",
              file=sys.stderr)
        return 2
    out = Path(args.out or Path(args.run) / "tensorboard")
    # The records' times count from the job's start; the log's last write ends the job.
    start = metrics.stat().st_mtime - max(p.t for p in points)
    try:
        runs = write_events(points, out, start)
    except TensorBoardMissing as exc:
        print(f"paramserver tensorboard: {exc}", file=sys.stderr)
        return 2
    print(f"{len(points)} points for {len(runs)} runs ({', '.join(r.name for r in runs)}) in "
          f"{out}\nview them: tensorboard --logdir {out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "tensorboard", help=SUMMARY["tensorboard"],
        description="Write TensorBoard event files from RUN/metrics.jsonl: per worker "
                    "(runs worker-0, worker-1, ...) loss, batch size, wait, compute time and "
                    "staleness over its steps; test accuracy and loss (run eval) over the "
                    "samples trained; for a simulated run with steps.npz, run bands: the "
                    "quantiles across workers of wait, compute time and staleness over the "
                    "steps (time/wait_s/q50, ...). Needs the optional tensorboard package "
                    "(pip install 'paramserver[tensorboard]').")
    p.add_argument("run", metavar="RUN", help="a run folder (train, launch, simulate)")
    p.add_argument("--out", metavar="DIR", help="where to write (default: RUN/tensorboard)")
    p.set_defaults(func=_run)
