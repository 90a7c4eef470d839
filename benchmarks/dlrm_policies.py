"""DLRM on the synthetic click log: time to a target test AUC under each sync policy, with one
slow worker.

Every run is `paramserver train --model dlrm --dataset clicks` with the same sample budget,
emulated device time (so a step's length is set by the batch and the straggler factor, not by
who else uses this machine's cores) and one worker `--slow`x slower. Policies are interleaved
within each repeat (seeds seed..seed+k-1; the click log itself is the same in every run), and
the table gives medians over repeats: seconds to the target AUC (from the evaluator's records
every --eval-interval), the final AUC, steps per second, the mean wait fraction, and the time
to target as a ratio to BSP's.

Usage: python benchmarks/dlrm_policies.py [--repeats 3] [--target 0.70] [--policies bsp,asp]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

POLICIES = ("bsp", "asp", "ssp", "dssp", "r2sp", "lbbsp", "ebsp")


def config(policy: str, seed: int, args):
    from paramserver.spec.config import TrainConfig
    return TrainConfig(
        sync=policy, model="dlrm", dataset="clicks",
        dataset_options={"train": args.train, "test": args.test}, workers=args.workers,
        servers=args.servers, batch_size=args.batch_size, lr=args.lr, epochs=args.epochs,
        straggler=f"1:{args.slow:g}", device_time=args.device_time, seed=seed,
        eval_interval=args.eval_interval)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.70, help="test AUC (chance: 0.5)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--slow", type=float, default=3.0, help="worker 1's slowdown factor")
    p.add_argument("--device-time", default="0.1ms", help="emulated compute per sample")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--train", type=int, default=200_000)
    p.add_argument("--test", type=int, default=10_000)
    p.add_argument("--eval-interval", type=float, default=0.5)
    p.add_argument("--out", help="keep the run folders here (default: a temporary folder)")
    args = p.parse_args()
    from paramserver.launch.jobs import run_training

    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    print(f"DLRM on clicks ({args.train} train / {args.test} test), {args.workers} workers x "
          f"{args.servers} servers, batch {args.batch_size}, lr {args.lr}, {args.epochs:g} "
          f"epochs, device time {args.device_time}/sample, worker 1 {args.slow:g}x slower; "
          f"target AUC {args.target}; {args.repeats} repeat(s), medians", flush=True)
    results: dict[str, list[dict]] = {p: [] for p in policies}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        for rep in range(args.repeats):
            for policy in policies:
                t0 = time.perf_counter()
                s = run_training(config(policy, args.seed + rep, args),
                                 root / f"{policy}-rep{rep}", quiet=True, timeout=900)
                hit = _time_to(root / f"{policy}-rep{rep}", args.target)
                results[policy].append({"tta": hit, "auc": s["final_test_auc"],
                                        "steps_per_s": s["steps_per_s"],
                                        "wait": s["mean_wait_fraction"],
                                        "train_s": s["wall_time_s"]})
                print(f"  rep {rep} {policy:>6}: time to AUC {args.target}: "
                      f"{fmt(hit, '.2f')} s, final AUC {s['final_test_auc']:.4f} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    base = median(r["tta"] for r in results.get("bsp", []))
    print(f"\n{'policy':>6} {'time to AUC ' + format(args.target, 'g'):>16} {'vs bsp':>7} "
          f"{'reached':>8} {'final AUC':>9} {'steps/s':>8} {'wait':>6}")
    for policy, runs in results.items():
        tta = median(r["tta"] for r in runs)
        reached = sum(r["tta"] is not None for r in runs)
        ratio = None if tta is None or not base else tta / base
        print(f"{policy:>6} {fmt(tta, '.2f') + ' s':>16} {fmt(ratio, '.2f') + 'x':>7} "
              f"{reached:>4}/{len(runs):<3} {median(r['auc'] for r in runs):9.4f} "
              f"{median(r['steps_per_s'] for r in runs):8.1f} "
              f"{median(r['wait'] for r in runs):6.1%}")
    return 0


def _time_to(run_dir: Path, target: float) -> float | None:
    """Seconds until the evaluator's test AUC first reached `target` (any target, not only the
    summary's list)."""
    from paramserver.runlog.metrics import read_records
    evals = sorted((r for r in read_records(run_dir / "metrics.jsonl")
                    if r.get("kind") == "eval" and r.get("auc") is not None),
                   key=lambda r: r["t"])
    return next((round(e["t"], 3) for e in evals if e["auc"] >= target), None)


if __name__ == "__main__":
    sys.exit(main())
