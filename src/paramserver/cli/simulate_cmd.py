"""`paramserver simulate`: a sync policy with thousands of virtual workers, in virtual time."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.cli import catalog
from paramserver.emulation.stragglers import STRAGGLER_HELP
from paramserver.policies.batch_rule import HELP as BATCH_RULE_HELP

# The simulator (numpy, the policies) loads when this command's parser is built, not when
# `paramserver --help` lists the commands.
EPILOG = """--compute SPEC
{compute_help}

--straggler SPEC (applied on top of --compute, at the virtual time a step starts computing)
{straggler_help}

Communication: each pull and push holds a server link (one per direction, FIFO) for
model bytes / servers / bandwidth seconds; every message also takes --latency one way.
--comm trace:RUN replays instead each worker's recorded pull_s and push_s, step by step, from
a live run's folder (or metrics.jsonl), plus the step time no field records and the wait
before the start barrier; --latency is then each coordinator message's (release, clock).
`paramserver.sim.replay` builds the whole mirror of a live run (benchmarks/replay_check.py).

--membership SCHEDULE
{membership_help}
Each change is an event in events.jsonl (worker_joined, preemption_notice, worker_left with
reason preempted, membership_skipped; batch_rule with the terms after each change, as a live
elastic job writes them), a record in metrics.jsonl (membership, left) and a row of the
report's membership timeline; summary.json's simulator.membership lists them. --batch-rule
(as train's) says what the batch becomes as workers come and go; its reference head count is
--workers, the workers the run starts with.

The end: --steps per worker, or --max-samples shared by all workers as in a live job: from
the clock that reaches the budget on, every release says stop (steps under way finish).

Quantities use the grammar of every flag (paramserver.core.units): --bandwidth 10Gbit/s reads
as --link 10Gbit/s does; --latency 50us; --param-bytes 100MB.

Writes config.json, job.json, metrics.jsonl, events.jsonl and summary.json like a live run,
and steps.npz: per-worker totals, the staleness histogram and per-step quantiles across workers.
--detail: each worker step as a metrics.jsonl record ("steps"), or steps.npz only ("summary":
metrics.jsonl then holds the workers leaving and the evaluations); "auto" (the default) writes
the steps while workers x steps <= {detail_limit:,} (a 10,000 x 100 run: 240 MB of log else)."""

CHUNK = 20_000  # events between progress updates (and chances to notice Ctrl-C promptly)
# Seconds between progress lines when stdout is no terminal (a log file, CI, nohup): rich's bar
# draws nothing there until the end, and a run of 10^5 workers takes minutes.
PLAIN_EVERY = 10.0


def add_sim_args(p) -> None:
    from paramserver.sim.run import SimConfig
    d = SimConfig()
    p.add_argument("--sync", default=d.sync,
                   help=f"sync policy: {catalog.listed(catalog.SYNC_POLICIES)} (default {d.sync})")
    p.add_argument("--sync-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="sync-policy option, e.g. staleness=3 (repeatable)")
    p.add_argument("--workers", type=flag.positive_int, default=d.workers,
                   help=f"virtual workers (default {d.workers}); with --membership the "
                        f"workers it starts with, more may join")
    p.add_argument("--steps", type=flag.positive_int, default=None,
                   help=f"steps per worker (default {d.steps}, none with --max-samples)")
    p.add_argument("--max-samples", type=flag.positive_int, default=None,
                   help="sample budget shared by all workers, as a live job's (default none)")
    p.add_argument("--batch-size", type=flag.positive_int, default=d.batch_size,
                   help=f"samples per worker step (default {d.batch_size})")
    p.add_argument("--compute", default=d.compute,
                   help=f"compute-time model (default {d.compute}; grammar below)")
    p.add_argument("--straggler", default=d.straggler, type=flag.straggler,
                   help="slowness on top of --compute, same grammar as train (default none)")
    p.add_argument("--bandwidth", default=d.bandwidth, type=flag.checked_text(flag.bandwidth),
                   help=f"per server link and direction, e.g. 10Gbit/s, 1.25GB/s, inf "
                        f"(default {d.bandwidth})")
    p.add_argument("--latency", default=d.latency, type=flag.checked_text(flag.duration),
                   help=f"one-way latency per message, e.g. 50us, 1ms, 0 (default {d.latency})")
    p.add_argument("--comm", default=None, metavar="trace:RUN",
                   help="replay a live run's pull/push times instead of the link model")
    p.add_argument("--comm-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="with --comm: residual=false drops the unrecorded step time, "
                        "start_waits=false the pre-barrier waits (repeatable)")
    p.add_argument("--servers", type=flag.positive_int, default=d.servers,
                   help=f"shards (default {d.servers})")
    p.add_argument("--model", default=d.model, help=f"model for the byte count and --train "
                                                    f"(default {d.model})")
    p.add_argument("--model-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="model option, e.g. hidden=64 (repeatable)")
    p.add_argument("--dataset", default=d.dataset, help=f"dataset (default {d.dataset})")
    p.add_argument("--data-dir", help="folder with the MNIST IDX files (for --dataset mnist)")
    p.add_argument("--dataset-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="dataset option, e.g. samples=50000 for synthetic (repeatable)")
    p.add_argument("--param-bytes", type=flag.checked_text(flag.size),
                   help="model size for the transfers, e.g. 100MB (default: the size of "
                        "--model, built once)")
    p.add_argument("--dtype", default=d.dtype, choices=("float32", "float64"),
                   help="float32 or float64 parameters")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument("--membership", type=flag.membership, default=d.membership,
                   metavar="SCHEDULE",
                   help="workers that join and leave in virtual time, e.g. "
                        "join@30s*2,leave@60s:w1 (grammar below; default none)")
    p.add_argument("--batch-rule", type=flag.batch_rule, default=d.batch_rule,
                   help=f"with --membership: {BATCH_RULE_HELP} (default {d.batch_rule})")


def add_train_args(p) -> None:
    from paramserver.sim.run import SimConfig
    d = SimConfig()
    p.add_argument("--train", action="store_true",
                   help="train --model for real on the simulated schedule (one process)")
    p.add_argument("--lr", type=flag.positive_number, default=d.lr,
                   help=f"learning rate (default {d.lr})")
    p.add_argument("--optimizer", default=d.optimizer, help=f"server update rule (default "
                                                            f"{d.optimizer})")
    p.add_argument("--optimizer-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="update-rule option, e.g. momentum=0.9 (repeatable)")
    p.add_argument("--eval-interval", type=flag.positive_seconds, default=d.eval_interval,
                   help=f"virtual seconds between test evaluations (default {d.eval_interval:g})")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads for --train")


def config_from_args(args):
    from paramserver.sim.run import SimConfig
    steps = args.steps if args.steps is not None else (
        None if args.max_samples else SimConfig().steps)
    return SimConfig(
        sync=args.sync, sync_options=flag.options(args.sync_opt), workers=args.workers,
        steps=steps, max_samples=args.max_samples, batch_size=args.batch_size,
        compute=args.compute, straggler=args.straggler, bandwidth=args.bandwidth,
        latency=args.latency, comm=args.comm,
        comm_options=flag.options(args.comm_opt),
        servers=args.servers, model=args.model, dataset=args.dataset, data_dir=args.data_dir,
        dataset_options=flag.options(args.dataset_opt),
        model_options=flag.options(args.model_opt), param_bytes=args.param_bytes,
        dtype=args.dtype, seed=args.seed, train=args.train, lr=args.lr,
        optimizer=args.optimizer, optimizer_options=flag.options(args.optimizer_opt),
        eval_interval=args.eval_interval, threads=args.threads,
        detail=getattr(args, "detail", None) or SimConfig().detail,
        membership=getattr(args, "membership", None) or SimConfig().membership,
        batch_rule=getattr(args, "batch_rule", None) or SimConfig().batch_rule)


def drive(sim, quiet: bool) -> tuple[bool, float]:
    """Run to the end or to Ctrl-C, with a progress bar (on a terminal; elsewhere a line every
    PLAIN_EVERY seconds); returns (complete, wall seconds)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    engine, total = sim.engine, sim.engine.total_steps
    by_samples = total is None and bool(sim.cfg.max_samples)  # progress in samples
    if by_samples:
        total = sim.cfg.max_samples
    name = f"{sim.cfg.sync} x{sim.cfg.workers} (sim)"
    plain = not quiet and not sys.stdout.isatty()
    bar = None if quiet or plain else Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), transient=False)
    t0, done = time.perf_counter(), False
    line_at = t0 + PLAIN_EVERY
    try:
        if bar is not None:
            bar.start()
            task = bar.add_task(name, total=total, info="")
        while not done:
            done = sim.advance(CHUNK)
            now = time.perf_counter()
            rate = engine.events / max(now - t0, 1e-9)
            completed = engine.samples if by_samples else engine.steps_done
            if bar is not None:
                bar.update(task, completed=completed,
                           info=f"virtual {engine.now:9.2f} s  {rate:9,.0f} events/s")
            elif plain and not done and now >= line_at:
                line_at = now + PLAIN_EVERY
                unit = "samples" if by_samples else "steps"
                of = f" of {total:,} {unit} ({completed / total:.0%})" if total else f" {unit}"
                print(f"{name}: {completed:,}{of}, virtual {engine.now:.2f} s, {rate:,.0f} "
                      f"events/s, {now - t0:.0f} s", flush=True)
    except KeyboardInterrupt:
        print("interrupted: keeping what was simulated so far", file=sys.stderr)
    finally:
        if bar is not None:
            bar.stop()
    return done, time.perf_counter() - t0


def print_summary(s: dict, run_dir: Path) -> None:
    sim = s["simulator"]
    state = "" if sim["complete"] else " (interrupted)"
    samples_per_s = s["samples"] / s["wall_time_s"] if s["wall_time_s"] else 0.0
    print(f"{s['sync']} x{s['workers']}{state}: {s['steps']} steps in {s['wall_time_s']:.3f} "
          f"virtual s, {s['steps_per_s']:.1f} steps/s, {samples_per_s:.0f} samples/s")
    print(f"  mean wait {s['mean_wait_fraction']:.1%}, mean staleness {s['mean_staleness']:.2f}, "
          f"updates applied {s['updates_applied']}")
    if s.get("final_test_accuracy") is not None:
        tta = ", ".join(f"{k}: {'-' if v is None else f'{v:.2f}s'}"
                        for k, v in s["time_to_accuracy"].items())
        print(f"  final test accuracy {s['final_test_accuracy']:.4f}; time to accuracy: {tta}")
    for m in sim.get("membership", []):
        what = (m["change"] if "why" in m else
                f"worker {m['worker']} {m['change']}, {m['workers']} training")
        print(f"  t={m['t']:.3f} s: {what}" + (f" ({m['why']})" if "why" in m else ""))
    print(f"  simulator: {sim['events']} events in {sim['wall_s']:.2f} s "
          f"({sim['events_per_s']:,.0f} events/s)")
    print(f"  run folder: {run_dir}")


def _run(args) -> int:
    from paramserver.sim import SimError, Simulation
    try:
        cfg = config_from_args(args)
        run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-sim-{cfg.sync}")
        sim = Simulation(cfg, run_dir)
    except (ValueError, FileNotFoundError) as exc:
        print(f"paramserver simulate: {exc}", file=sys.stderr)
        return 2
    try:
        complete, wall = drive(sim, args.quiet)
    except SimError as exc:
        sim.close(complete=False)
        print(f"paramserver simulate: the policy broke the protocol: {exc}", file=sys.stderr)
        return 1
    extra = {"wall_s": round(wall, 3), "events_per_s": round(sim.engine.events / max(wall, 1e-9))}
    print_summary(sim.close(complete, extra), run_dir)
    return 0 if complete else 130


# The one-line help of each command here (cli.main lists them without building parsers).
SUMMARY = {"simulate": "simulate a sync policy with many virtual workers"}


def register(sub) -> None:
    from paramserver.sim.core.compute import COMPUTE_HELP
    from paramserver.sim.core.membership import MEMBERSHIP_HELP
    from paramserver.sim.run import DETAIL_LIMIT, DETAILS
    epilog = EPILOG.format(compute_help=COMPUTE_HELP, straggler_help=STRAGGLER_HELP,
                           detail_limit=DETAIL_LIMIT, membership_help=MEMBERSHIP_HELP)
    p = sub.add_parser("simulate", help=SUMMARY["simulate"],
                       description="Drive the live sync policies with virtual workers in "
                                   "virtual time (discrete events):\ncompute-time models, "
                                   "stragglers and server link contention, workers joining "
                                   "and\nleaving (--membership); optionally train a small "
                                   "model on the simulated schedule.",
                       epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sim_args(p)
    add_train_args(p)
    p.add_argument("--out", type=flag.out_folder,
                   help="run folder (default runs/<time>-sim-<sync>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--detail", choices=DETAILS, default="auto",
                   help="per-worker step records in metrics.jsonl: steps, summary (steps.npz "
                        "only) or auto (steps for small runs; default auto)")
    p.set_defaults(func=_run)
