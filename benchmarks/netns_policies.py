"""BSP, ElasticBSP and LB-BSP across three namespaced hosts, one worker behind a tbf-limited link.

Builds the lab of `paramserver.launch.netlab` (needs root and iproute2): host 0 runs the coordinator,
the server and the evaluator, hosts 1 and 2 one worker each over TCP; host 2's link is
limited with tc tbf both ways (default 30mbit: each 2.25 MB pull or push of the digits MLP
takes about 0.6 s there, against a few ms on the free link). Every policy trains the same job
(same sample budget, lr and seed) and the table gives the wall time from the start of training
to the target test accuracy, the final and best accuracy, and each worker's steps.

Usage: python benchmarks/netns_policies.py [--rate 30mbit] [--epochs 3] [--lr 0.3]
       [--target 0.9] [--policies bsp,ebsp,lbbsp] [--baseline]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from paramserver.launch.jobs import prepare_job
from paramserver.spec.config import TrainConfig
from paramserver.runlog.metrics import summarize
from paramserver.launch.netlab import NetLab, netns_unavailable, remove_stale
from paramserver.launch.netlab_run import run_job
from paramserver.policies import SYNC_POLICIES

SLOW_HOST = 2


def run_policy(lab: NetLab, sync: str, args, out: Path) -> dict:
    cfg = TrainConfig(sync=sync, workers=2, servers=1, epochs=args.epochs, lr=args.lr,
                      batch_size=args.batch_size, seed=args.seed, eval_interval=args.eval_interval,
                      max_seconds=args.max_seconds, heartbeat_timeout=10.0)
    job = prepare_job(cfg)
    run = run_job(lab, job, out, timeout=args.max_seconds + 240)
    s = summarize(run.records, {**job, "apply_mode": SYNC_POLICIES.get(sync).apply_mode},
                  targets=(args.target,))
    s["steps_by_host"] = {h: s["per_worker"].get(str(r), {}).get("steps", 0)
                          for h, r in run.rank_of_host.items()}
    (out / "summary.json").write_text(json.dumps(s, indent=2))
    return s


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="30mbit", help="tbf rate of host 2's link (default 30mbit)")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.9, help="test accuracy (default 0.9)")
    p.add_argument("--eval-interval", type=float, default=0.5)
    p.add_argument("--max-seconds", type=float, default=150.0,
                   help="training-time cap per run (default 150)")
    p.add_argument("--policies", default="bsp,ebsp,lbbsp")
    p.add_argument("--baseline", action="store_true",
                   help="also run the first policy with no tbf on any link")
    p.add_argument("--keep", help="keep the run folders here (default: a temporary folder)")
    args = p.parse_args()
    reason = netns_unavailable()
    if reason:
        print(f"cannot build the namespaced hosts: {reason}", file=sys.stderr)
        return 2
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    for name in policies:
        SYNC_POLICIES.get(name)  # an unknown name fails here, with the known ones
    runs = [(name, args.rate) for name in policies]
    if args.baseline:
        runs.append((policies[0], None))
    print(f"digits MLP, 2 workers on hosts 1 and 2, coordinator + server on host 0; host 2's "
          f"link tbf {args.rate} both ways; {args.epochs:g} epochs, lr {args.lr}, batch "
          f"{args.batch_size}, target accuracy {args.target}")
    head = (f"{'policy':>7} {'host-2 link':>11} {'to ' + format(args.target, 'g'):>9} "
            f"{'final acc':>9} {'best acc':>9} {'train s':>8} {'steps h1/h2':>12}")
    print(head)
    remove_stale()
    with tempfile.TemporaryDirectory() as tmp, NetLab(3) as lab:
        base = Path(args.keep or tmp)
        for i, (name, rate) in enumerate(runs):
            if rate:
                lab.shape(SLOW_HOST, rate)
            else:
                lab.unshape(SLOW_HOST)
            s = run_policy(lab, name, args, base / f"{i}-{name}-{rate or 'free'}")
            tta = s["time_to_accuracy"][f"{args.target:g}"]
            steps = f"{s['steps_by_host'].get(1, 0)}/{s['steps_by_host'].get(2, 0)}"
            print(f"{name:>7} {rate or 'free':>11} {fmt(tta, '8.1f') + 's':>9} "
                  f"{fmt(s['final_test_accuracy'], '9.4f')} {fmt(s['best_test_accuracy'], '9.4f')}"
                  f" {s['wall_time_s']:8.1f} {steps:>12}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
