"""`paramserver calibrate`: live runs of a grid of settings against the simulator's predictions.

The grid is policies x straggler scenarios x links on this machine (emulated device time and
emulated links, compare's machinery and layout), with repeats. From the finished runs it fits
the convergence model (calibration.json, for `advise --calibration`), then predicts each cell's
time to the target accuracy through the simulator, leave-one-out: the convergence model and
the per-message latency a cell's prediction uses are fitted on the other cells' runs only.
calibration.html and calibration.csv show predicted against measured per cell and policy.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from paramserver.cli import args as flag

DEFAULT_SCENARIOS = ["one-slow", "homogeneous"]


def calibrated_policies() -> str:
    """The policies a grid runs by default: the registry's, but those that run others."""
    from paramserver.policies import SYNC_POLICIES
    return ",".join(n for n in SYNC_POLICIES.names() if SYNC_POLICIES.get(n).calibrated)


def grid_policies(arg: str | None) -> list[str]:
    """The policies a grid runs: --sync's, or calibrated_policies(). One that is not calibrated
    itself (auto: advise predicts it from the runs of those it switches among) is refused."""
    from paramserver.cli.compare_cmd import _policies
    from paramserver.policies import SYNC_POLICIES
    names = _policies(arg or calibrated_policies())
    uncalibrated = [n for n in names if not SYNC_POLICIES.get(n).calibrated]
    if uncalibrated:
        raise ValueError(f"--sync {','.join(uncalibrated)}: not calibrated by runs of its own "
                         f"(advise predicts it from the runs of the policies it switches "
                         f"among); leave it out, or leave --sync out for every policy that is")
    return names


def _base_config(args):
    from paramserver.cli.compare_cmd import DEFAULTS, rule_pairing
    changes = {k: getattr(args, k) for k in ("epochs", "lr", "batch_size", "seed",
                                             "eval_interval", "device_time")
               if getattr(args, k) is not None}
    # compare's pairing: SSP, EBSP and DSSP run with their own update rule unless --optimizer
    # names one for every run, so the grid measures the policies as compare and advise run them.
    rule, _ = rule_pairing(args.optimizer)
    return dataclasses.replace(DEFAULTS, optimizer=rule, **changes)


def _pairs(args) -> dict[str, str]:
    from paramserver.cli.compare_cmd import rule_pairing
    return rule_pairing(args.optimizer)[1]


def _link_label(link: str) -> str:
    return "unlimited" if link in ("", "unlimited", "none") else link


def plan_grid(args, out: Path) -> list:
    """The grid's runs (compare's PlannedRun), repeats interleaved across links and worker
    counts; with several worker counts each has a folder of its own under its link's."""
    from paramserver.emulation.links import LinkTable
    from paramserver.emulation.trace_io import read_trace
    from paramserver.spec.compare_plan import parse_scenarios, plan_runs
    policies = grid_policies(args.sync)
    scenarios = parse_scenarios(args.scenario or DEFAULT_SCENARIOS, read_trace)
    base = _base_config(args)
    counts = _worker_counts(args, base)
    runs = []
    for link in args.grid_link or ["unlimited"]:
        label = _link_label(link)
        for n in counts:
            cfg = dataclasses.replace(base, workers=n, links=LinkTable.parse(
                [] if label == "unlimited" else [link]))
            cfg.validate()
            folder = out / "grid" / label.replace("/", "_")
            if len(counts) > 1:
                folder = folder / f"{n}-workers"
            runs += plan_runs(cfg, policies, scenarios, args.repeats, folder, single=False,
                              policy_optimizers=_pairs(args))
    runs.sort(key=lambda r: r.repeat)  # repeats interleaved across the grid: load drifts alike
    return runs


def _worker_counts(args, base) -> list[int]:
    """The grid's worker counts: each --workers once, in order (default compare's)."""
    return list(dict.fromkeys(args.workers)) if args.workers else [base.workers]


def run_grid(args, out: Path, console) -> list[str]:
    """The live grid into out/grid/LINK/runs/SCENARIO/POLICY/rep-K; returns failures."""
    from paramserver.launch.jobs import run_training
    from paramserver.launch.local import LaunchError
    policies = grid_policies(args.sync)
    scenarios = args.scenario or DEFAULT_SCENARIOS
    runs = plan_grid(args, out)
    failed = []
    console.print(f"calibrate: {len(runs)} live runs ({', '.join(policies)} x "
                  f"{', '.join(scenarios)} x {len(args.grid_link or ['unlimited'])} link(s) x "
                  f"{len(args.workers or [None])} worker count(s) x {args.repeats} repeat(s)) "
                  f"into {out / 'grid'}")
    for i, run in enumerate(runs, 1):
        t0 = time.perf_counter()
        console.print(f"[{i}/{len(runs)}] {run.folder.relative_to(out / 'grid')} ...")
        try:
            run_training(run.config, run.folder, quiet=True, timeout=args.run_timeout)
        except LaunchError as exc:
            failed.append(f"{run.folder}: {str(exc).splitlines()[0]}")
            console.print(f"  failed: {str(exc).splitlines()[0]}")
            continue
        console.print(f"  done ({time.perf_counter() - t0:.0f} s)")
    return failed


def _load_average() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def _run(args) -> int:
    from rich.console import Console

    from paramserver.advise.calibrate import calibrate, write_outputs
    console = Console()
    out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-calibrate")
    source = Path(args.runs_from) if args.runs_from else out / "grid"
    command = "paramserver " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["calibrate"] else (
        "paramserver calibrate")
    load = {"before": _load_average(), "cpus": _cpus()} if not args.runs_from else {
        "note": f"the runs under {args.runs_from} were made before this command; their load "
                f"was not measured by it", "cpus": _cpus()}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    failed: list[str] = []
    try:
        if not args.runs_from:
            plan_grid(args, out)  # its policies, scenarios, links and settings refused
            out.mkdir(parents=True, exist_ok=True)  # before the run folder is made
            try:
                failed = run_grid(args, out, console)
            except KeyboardInterrupt:
                print(f"paramserver calibrate: interrupted; the finished runs are kept in "
                      f"{source} (paramserver calibrate --from {source} calibrates on them)",
                      file=sys.stderr)
                return 130
        if not args.runs_from:
            load["after"] = _load_average()
        result = calibrate(source, out, target=args.target, console=console,
                           meta={"command": command, "date": started, "load_average": load,
                                 "failed_runs": failed})
    except ValueError as exc:
        print(f"paramserver calibrate: {exc}", file=sys.stderr)
        return 2
    paths = write_outputs(result, out)
    console.print(f"calibration: {paths['json']}\nreport: {paths['html']}")
    bad = [v.policy for v in result.verdicts if not v.within_goal]
    console.print("every policy within 15% of the live median" if not bad else
                  f"outside 15% in some cell: {', '.join(bad)}")
    return 0


def _cpus() -> int:
    import os
    return os.cpu_count() or 1


SUMMARY = {"calibrate": "live runs of a settings grid against the simulator's predictions"}


def register(sub) -> None:
    p = sub.add_parser(
        "calibrate", help=SUMMARY["calibrate"],
        description="Run a grid of live jobs (policies x straggler scenarios x links x worker "
                    "counts, emulated "
                    "device time and links, with repeats; compare's defaults otherwise), fit "
                    "the convergence model from them (calibration.json, for advise "
                    "--calibration), predict each cell's time to the target accuracy through "
                    "advise's cluster fit and simulator, leave-one-out (a cell's prediction "
                    "never sees its own runs; its profiles are the other policies' runs) "
                    "and write calibration.html and calibration.csv: predicted against the live "
                    "median per cell and policy, error %, the live spread, and the seed claims "
                    "live and simulated.")
    p.add_argument("--sync", default=None,
                   help="comma-separated policies (default: every policy but auto, which "
                        "advise predicts from the runs of those it switches among; a policy "
                        "the grid never ran is predicted from its apply mode's runs alone)")
    p.add_argument("--scenario", action="append", metavar="NAME|NAME=SPEC",
                   help="straggler scenario, as compare takes it (repeatable; default "
                        + ", ".join(DEFAULT_SCENARIOS) + ")")
    p.add_argument("--grid-link", action="append", metavar="RATE[,LATENCY]|unlimited",
                   help="an emulated link for every worker, one grid axis (repeatable; "
                        "default unlimited), e.g. --grid-link unlimited --grid-link 1gbit,1ms")
    p.add_argument("--repeats", type=flag.positive_int, default=2,
                   help="repeats per cell, seeds seed..seed+k-1 (default 2)")
    p.add_argument("--target", type=flag.accuracy, default=0.95,
                   help="target test accuracy (default 0.95)")
    p.add_argument("--epochs", type=float, help="sample budget in epochs (default compare's)")
    p.add_argument("--lr", type=flag.positive_number, help="learning rate (default compare's)")
    from paramserver.cli.compare_cmd import paired_text
    p.add_argument("--optimizer", help="update rule of every run (default compare's, with its "
                                       f"pairing: {paired_text()})")
    p.add_argument("--workers", type=flag.positive_int, action="append",
                   help="workers, one grid axis (repeatable; default compare's), e.g. "
                        "--workers 4 --workers 8: the convergence model then sees each policy "
                        "at two update batches and staleness levels")
    p.add_argument("--batch-size", type=flag.positive_int, help="batch (default compare's)")
    p.add_argument("--device-time", type=flag.device_time,
                   help="emulated device time per sample (default compare's)")
    p.add_argument("--eval-interval", type=flag.seconds,
                   help="seconds between evaluations (default compare's)")
    p.add_argument("--seed", type=flag.count, help="first seed (default compare's)")
    p.add_argument("--from", dest="runs_from", metavar="DIR",
                   help="skip the live grid: calibrate on the finished runs under DIR (a "
                        "calibrate or compare folder)")
    p.add_argument("--out", type=flag.out_folder,
                   help="output folder (default runs/<time>-calibrate)")
    p.add_argument("--run-timeout", type=flag.positive_seconds, default=600.0,
                   help="give up on one run after this many seconds (default 600)")
    p.set_defaults(func=_run)
