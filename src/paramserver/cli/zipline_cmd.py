"""`paramserver zipline`: run the ElasticBSP synchronization-point search on a file of push times."""

from __future__ import annotations

import argparse
import json
import sys
import time

from paramserver.cli import catalog

_EPILOG = """\
file formats:
  history  lines 'WORKER:t1,t2,...,' (worker ids; rows are put in id order)
  csv      one row of comma-separated times per worker (an optional header line)
  .npy     a 2-D numeric array, workers x times
Without --predicted, each row is a worker's recorded push times and the next R are predicted
with --predictor (default last_interval: t_last + r*(t_last - t_prev), r = 0..R-1).
With --predicted, rows already are predicted times; --lookahead R then keeps the first R.

output (--json): spread, barrier, low, sync_index (per worker, in worker order: the index of
its last predicted push at or before the barrier), workers (ids), n_workers, variant, seconds
(search time only), lookahead, predicted, predictor (the settings it ran with).
exit codes: 0 ok, 2 bad input.
"""


# The one-line help of each command here (cli.main lists them without building parsers).
SUMMARY = {"zipline": "find the ElasticBSP synchronization point (ZipLine search)"}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "zipline",
        help=SUMMARY["zipline"],
        description="Choose one predicted push time per worker so that max - min (the spread) "
                    "is smallest; ties go to the earliest barrier, then the earliest start.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", metavar="FILE", help="push times: history text, .csv or .npy")
    p.add_argument("--lookahead", "-R", type=int, metavar="R",
                   help="predicted pushes per worker (required unless --predicted)")
    p.add_argument("--variant", default=catalog.ZIPLINE_DEFAULT, metavar="NAME",
                   help=f"search variant: {catalog.listed(catalog.ZIPLINE_VARIANTS)} "
                        f"(default {catalog.ZIPLINE_DEFAULT})")
    p.add_argument("--predicted", action="store_true",
                   help="FILE already holds predicted push times")
    p.add_argument("--predictor", default="last_interval", metavar="NAME",
                   help=f"push-time predictor: {catalog.listed(catalog.PREDICTORS)} "
                        f"(default last_interval)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=run)


def _times(args: argparse.Namespace) -> tuple[list, list[int]]:
    from paramserver.predict import get_predictor
    from paramserver.zipline.io import read_times
    if args.lookahead is not None and args.lookahead < 1:
        raise ValueError(f"--lookahead must be >= 1, got {args.lookahead}")
    if args.lookahead is None and not args.predicted:
        raise ValueError("--lookahead R is required (or pass --predicted)")
    data = read_times(args.file)
    if args.predicted:
        rows = data.rows if args.lookahead is None else [r[:args.lookahead] for r in data.rows]
        return rows, data.worker_ids
    return get_predictor(args.predictor)(data.rows, args.lookahead), data.worker_ids


def _summary(plan, workers: list[int], args, seconds: float) -> str:
    import numpy as np
    idx = np.asarray(plan.sync_index)
    return (f"ZipLine ({args.variant}): {len(workers)} workers -> spread {plan.spread} "
            f"(window {plan.low} .. barrier {plan.barrier})\n"
            f"sync_index (predicted push per worker): min {idx.min()}, "
            f"median {np.median(idx):g}, max {idx.max()}; search took {seconds * 1e3:.2f} ms")


def run(args: argparse.Namespace) -> int:
    from paramserver.zipline import get_variant, search
    try:
        get_variant(args.variant)
        times, workers = _times(args)
        start = time.perf_counter()
        plan = search(times, args.variant)
        seconds = time.perf_counter() - start
    except ValueError as exc:  # every input error of io, predict and zipline is a ValueError
        print(f"paramserver zipline: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = plan.to_dict() | {"workers": workers, "n_workers": len(workers),
                                "variant": args.variant, "seconds": seconds,
                                "lookahead": args.lookahead, "predicted": args.predicted,
                                "predictor": None if args.predicted else args.predictor}
        print(json.dumps(out))
    else:
        print(_summary(plan, workers, args, seconds))
    return 0
