"""`paramserver advise`: which sync policy for my cluster, by prediction.

Profile the job (a run folder, a trace CSV, or a short live run started here), fit a cluster
model, simulate every policy and its main options at the target scale, turn each outcome into a
predicted time to the target accuracy through the convergence model, and recommend one.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.cli import catalog
from paramserver.core.bounded import json_value

SUMMARY = {"advise": "recommend a sync policy for a cluster from a short profile, by simulation"}

EPILOG = """Profile sources (exactly one):
  --profile RUN_DIR         a run folder of `paramserver train` (or compare's runs): its step
                            records, its emulated link (config.json) and its servers' load
  --profile TRACE.csv       recorded steps: worker,step,compute_s[,batch][,pull_s,push_s,bytes]
                            [,wait_s] (--trace-batch for a CSV without batch, --trace-link for
                            the link its times were recorded on)
  --live                    a short live run of a built-in --model here (--profile-seconds,
                            --profile-workers, --straggler, --device-time, --profile-link)
  --script 'CMD ...'        a short live run of your own worker script, as `paramserver launch`
                            runs it

What is fitted: per-worker compute cost per sample and its noise, persistent stragglers (a
worker k x the fast workers' median) and transient ones (steps far above their worker's own
median: a rate and a factor), the link the workers share (the run's emulated link, or
pull_s/push_s against bytes), a worker's own slower link (its pull_s + push_s well above the
others': only its share of the workers pays it), the coordinator's latency and the servers'
handling per message. At a target scale the fractions are kept (25% slow workers stay 25%), not
the ranks; --link sets the shared link, and a worker on a slower link of its own keeps what it
adds.

Each candidate (every policy; SSP and DSSP at a few staleness bounds) is simulated at the target
scale without --train; the convergence model (--calibration, from `paramserver calibrate`; the
shipped default otherwise) says how many samples it needs to reach the target at the staleness
and update batch the simulation shows, and what share of runs reach it at all (reach: from
which calibration runs diverged at which staleness; under 50%: never). Candidates
rank by their time over that share. auto is simulated switching as it would live: each
stretch under one of its candidates moves it toward the target by its samples over what that
candidate needs (advise.json lists the stretches). The table ranks by predicted time to target
with its band; the pick is "too close to call" when its band overlaps the runner-up's.

Writes advise.json (typed, versioned) into --out."""


def _link(text: str):
    """RATE[,LATENCY] or RATE/LATENCY (e.g. 100mbit/5ms, 10gbit, unlimited)."""
    from paramserver.advise.core.cluster import TargetLink
    from paramserver.core.units import UnitError, parse_duration
    from paramserver.emulation.links import parse_link
    head, sep, tail = text.rpartition("/")
    if sep and head:  # RATE/LATENCY, unless the slash is the rate's own (10Gbit/s)
        try:
            parse_duration(tail, "link latency")
            text = f"{head},{tail}"
        except UnitError:
            pass
    spec = parse_link(text)
    return TargetLink(spec.bytes_per_s, spec.latency)


target_link = flag._typed(_link, "link")


def register(sub) -> None:
    p = sub.add_parser("advise", help=SUMMARY["advise"], description=__doc__.split("\n\n")[1],
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", metavar="RUN_DIR|TRACE.csv",
                     help="a run folder or a recorded trace CSV to fit the cluster from")
    src.add_argument("--live", action="store_true",
                     help="profile a short live run of the built-in --model here")
    src.add_argument("--script", metavar="'CMD ...'",
                     help="profile a short live run of your worker script (through launch)")
    g = p.add_argument_group("the profiling run (--live, --script)")
    g.add_argument("--profile-seconds", type=flag.positive_seconds, default=15.0,
                   help="training time of the profiling run (default 15 s)")
    g.add_argument("--profile-workers", type=flag.positive_int, default=4,
                   help="workers of the profiling run (default 4)")
    g.add_argument("--model", default="mlp", help=f"{catalog.listed(catalog.MODELS)} "
                                                  f"(default mlp)")
    g.add_argument("--dataset", default="digits",
                   help=f"{catalog.listed(catalog.DATASETS)} (default digits)")
    g.add_argument("--data-dir", help="folder with the MNIST IDX files (for --dataset mnist)")
    g.add_argument("--straggler", default="none", help="slowness injected in the profiling run")
    g.add_argument("--device-time", default="off",
                   help="emulated device time per sample of the profiling run, e.g. 0.5ms")
    g.add_argument("--profile-link", action="append", metavar="[TARGET=]RATE[,LATENCY]",
                   type=flag.link, help="emulated link of the profiling run (as train --link)")
    g.add_argument("--trace-batch", type=flag.positive_int,
                   help="samples per step of a trace CSV without a batch column")
    g.add_argument("--trace-link", metavar="RATE[,LATENCY]",
                   help="the link a trace CSV's pull_s/push_s were recorded on, e.g. 100mbit")
    t = p.add_argument_group("the target")
    t.add_argument("--workers", type=flag.positive_int,
                   help="workers at the target scale (default: the profile's)")
    t.add_argument("--servers", type=flag.positive_int,
                   help="servers at the target scale (default: the profile's)")
    t.add_argument("--link", type=target_link, metavar="RATE[,LATENCY]",
                   help="each worker's link at the target, as train --link and calibrate "
                        "--grid-link take it: e.g. 100mbit,5ms, 10gbit, unlimited (RATE/LATENCY "
                        "is read too; default: the profile's)")
    t.add_argument("--batch-size", type=flag.positive_int,
                   help="samples per worker step (default: the profile's)")
    t.add_argument("--target", type=flag.accuracy,
                   help="test accuracy to reach (default: the calibration's target)")
    t.add_argument("--calibration", metavar="FILE",
                   help="calibration.json of `paramserver calibrate` (default: the shipped fit "
                        "for the digits MLP)")
    t.add_argument("--policies", help=f"candidates' policies, comma-separated "
                                      f"(default all: {catalog.listed(catalog.SYNC_POLICIES)})")
    t.add_argument("--max-sim-steps", type=flag.positive_int, default=200_000,
                   help="worker steps simulated per candidate at most; past them the time is "
                        "extrapolated at the steady rate (default 200000)")
    t.add_argument("--seed", type=flag.count, default=0, help="seed of the simulation's draws")
    p.add_argument("--out", type=flag.out_folder,
                   help="folder for advise.json and a live profile's run folder "
                        "(default runs/advise-<time>)")
    p.add_argument("--json", action="store_true", help="print advise.json instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_run)


def _say(args, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _out(args) -> Path:
    if not args.out:  # once per command: the profile and advise.json share the folder
        args.out = f"runs/advise-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(args.out)


def _profile(args):
    from paramserver.advise.profile import LiveProfileSpec, load_profile, profile_live
    if args.profile:
        return load_profile(args.profile, batch_size=args.trace_batch, link=args.trace_link)
    command: tuple = ()
    if args.script is not None:  # a command that cannot start is refused before the run
        from paramserver.cli.launch_cmd import worker_command
        try:
            words = shlex.split(args.script)
            if not words:
                raise ValueError("no command: give the worker command, e.g. --script 'python "
                                 "train.py'")
            # as launch runs it: a bare `python` is this interpreter, with torch and paramserver
            command = tuple(worker_command(words))
        except ValueError as exc:  # (shlex's too: an unclosed quote)
            raise ValueError(f"--script {args.script!r}: {exc}") from None
    out = _out(args) / "profile"
    spec = LiveProfileSpec(out=out, seconds=args.profile_seconds, workers=args.profile_workers,
                           model=args.model, dataset=args.dataset, data_dir=args.data_dir,
                           straggler=args.straggler,
                           device_time=args.device_time,
                           links=tuple(flag.links(args.profile_link).args()),
                           command=command)
    what = args.script or f"{args.model} on {args.dataset}"
    _say(args, f"profiling {what}: {args.profile_workers} workers for "
               f"{args.profile_seconds:g} s in {out} ...")
    return profile_live(spec)


def _convergence(args):
    from paramserver.advise.calibration_io import default_convergence
    from paramserver.predict.convergence import ConvergenceModel
    if not args.calibration:
        model = default_convergence()
    else:
        try:
            doc = json_value(Path(args.calibration).read_text())
        except OSError as exc:
            raise ValueError(f"cannot read --calibration {args.calibration}: "
                             f"{exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"--calibration {args.calibration} is not JSON: {exc}") from None
        model = ConvergenceModel.from_json(doc)
    if args.target is not None and abs(args.target - model.target) > 1e-9:
        raise ValueError(f"the convergence model counts samples to accuracy {model.target:g}, "
                         f"not {args.target:g}: fit one for that target with `paramserver "
                         f"calibrate --target {args.target:g}` and pass it with --calibration")
    return model


def _budget(model, candidate, params, max_steps: int) -> int:
    """Samples to simulate: the candidate's upper estimate, within the steps cap."""
    from paramserver.policies import SYNC_POLICIES
    mode = SYNC_POLICIES.get(candidate.policy).apply_mode
    batch = params.batch_size * (params.workers if mode == "round" else 1)
    try:
        band = model.samples_needed(candidate.policy, apply_mode=mode, update_batch=batch,
                                    staleness=0.0)
    except ValueError:
        band = None
    want = 1.25 * band.hi if band else 20 * params.workers * params.batch_size
    floor = 10 * params.workers * params.batch_size  # enough steps to see a steady state
    return int(min(max(want, floor), max_steps * params.batch_size))


def advise(args) -> dict:
    """The whole command without printing the table: advise.json's content."""
    from paramserver.advise.core.cluster import fit
    from paramserver.advise.core.outcome import simulate_policy
    from paramserver.advise.core.recommend import (
        ADVICE_VERSION, default_candidates, predict, recommend,
    )
    from paramserver.policies import SYNC_POLICIES
    policies = None
    if args.policies:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        for name in policies:
            SYNC_POLICIES.get(name)  # an unknown name fails here, with the known ones
    conv = _convergence(args)
    profile = _profile(args)
    cluster = fit(profile)
    params = cluster.at(args.workers or profile.workers, args.servers, args.link,
                        args.batch_size)
    _say(args, f"cluster: {'; '.join(cluster.notes) or 'no stragglers'}; simulating "
               f"{params.workers} workers x {params.servers} servers")
    predictions = []
    candidates = default_candidates(policies)
    for i, c in enumerate(candidates, 1):
        t0 = time.perf_counter()
        outcome = simulate_policy(params, c.policy, c.options_dict(),
                                  samples=_budget(conv, c, params, args.max_sim_steps),
                                  seed=args.seed)
        predictions.append(predict(c, outcome, conv))
        _say(args, f"  [{i}/{len(candidates)}] {c.label}: {outcome.samples_per_s:,.0f} "
                   f"samples/s, wait {outcome.wait_share:.0%} "
                   f"({outcome.events:,} events in {time.perf_counter() - t0:.1f} s)")
    rec = recommend(predictions, conv.target)
    return {"kind": "paramserver advise", "version": ADVICE_VERSION,
            "command": " ".join(["paramserver", "advise", *sys.argv[2:]]),
            "profile": {"source": profile.source, "workers": profile.workers,
                        "steps": len(profile.steps), "sync": profile.sync},
            "cluster": cluster.to_json(),
            "scale": {"workers": params.workers, "servers": params.servers,
                      "batch_size": params.batch_size,
                      "link": None if args.link is None else
                      {"rate_bytes_per_s": args.link.rate, "latency_s": args.link.latency},
                      "simulate": cluster.to_sim(params.workers, params.servers, args.link)},
            "convergence": {"target": conv.target, "source": conv.source},
            "recommendation": rec.to_json()}


def table(doc: dict) -> str:
    rec = doc["recommendation"]
    scale = doc["scale"]
    lines = [f"advise: {scale['workers']} workers x {scale['servers']} servers, "
             f"batch {scale['batch_size']}, time to accuracy {rec['target']:g} (predicted)",
             "", f"{'candidate':<22} {'time to target (band)':>26} {'reach':>6} "
                 f"{'samples/s':>10} {'wait':>6} {'stale':>6} {'upd batch':>9}"]
    for p in rec["ranked"]:
        t = p["time_to_target_s"]
        band = "never" if t is None else f"{t['mid']:.3g} s ({t['lo']:.3g}-{t['hi']:.3g})"
        lines.append(f"{p['label']:<22} {band:>26} {p['reach']:>6.0%} "
                     f"{p['samples_per_s']:>10,.0f} {p['wait_share']:>6.0%} "
                     f"{p['mean_staleness']:>6.2f} {p['update_batch']:>9.4g}")
    lines.append("")
    if rec["pick"] is None:
        lines.append("pick: none: no candidate is predicted to reach the target")
    elif rec["confidence"] == "too close to call":
        lines.append(f"pick: {rec['pick']} (too close to call: its band overlaps the "
                     f"runner-up's)")
    else:
        margin = "" if rec["margin"] is None else f", {rec['margin']:.2f}x sooner than the " \
                                                  f"runner-up"
        lines.append(f"pick: {rec['pick']} (clear{margin})")
    lines += [f"  {r}" for r in rec["reasons"]]
    return "\n".join(lines)


def _run(args) -> int:
    from paramserver.advise.core.cluster import ClusterFitError
    from paramserver.predict.convergence import ConvergenceError
    from paramserver.advise.profile import ProfileError
    from paramserver.launch.local import LaunchError
    try:
        doc = advise(args)
    except (ProfileError, ClusterFitError, ConvergenceError, ValueError,
            FileNotFoundError) as exc:  # (a data set's missing files, as train says them)
        print(f"paramserver advise: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"paramserver advise: the profiling run failed: {exc}", file=sys.stderr)
        return 1
    out = _out(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "advise.json").write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc, indent=2) if args.json else table(doc))
    if not args.json:
        print(f"  advise.json: {out / 'advise.json'}")
    return 0
