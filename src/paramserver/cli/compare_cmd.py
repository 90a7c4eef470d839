"""`paramserver compare`: the same training (the built-in task, or the user's script after `--`)
under each sync policy and scenario, then a report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.cli import catalog
from paramserver.cli.args import parse_options
from paramserver.cli.config_args import config_from_args
from paramserver.cli.train_cmd import (
    EPILOG, add_launcher_args, add_training_args, launcher_from_args)
from paramserver.launch.jobs import (check_model_size, check_named_ranks, check_pushes_fit_rule,
                                     resolve_servers)
from paramserver.emulation.trace_io import read_trace
from paramserver.spec.compare_plan import (
    SCENARIOS, SINGLE, THIRD, JoinAt, parse_scenarios, plan_runs, variant_settings,
)
from paramserver.spec.config import TrainConfig

# The default comparison: short on this machine, yet the straggler and the policies' answers
# to it dominate the timing (emulated device time), see the notes written into compare.json.
DEFAULTS = TrainConfig(epochs=12.0, device_time="0.5ms", lr=0.3, eval_interval=0.5)


def paired_optimizers() -> dict[str, str]:
    """policy -> the update rule it runs with when --optimizer is not given (the policy's own
    `paired_rule`, e.g. SSP's dynsgd, policies/ssp.py says why); every other policy takes
    DEFAULTS.optimizer, sgd."""
    from paramserver.policies import SYNC_POLICIES
    return {name: SYNC_POLICIES.get(name).paired_rule for name in SYNC_POLICIES.names()
            if SYNC_POLICIES.get(name).paired_rule}
NOTES = [
    "Timing uses emulated device time: a step lasts batch x cost-per-sample x straggler factor "
    "(a sleep topping up the real compute), as on a cluster where each worker has its own "
    "accelerator; the real-compute share says how faithful a run is.",
    "Every policy gets the same sample budget (epochs x training-set size), so the accuracy "
    "columns compare what each policy makes of the same amount of gradient computation.",
    "The default learning rate (0.3, three times the rate one worker trains digits with "
    "stably) is chosen so that staleness costs accuracy, not only time: policies that apply "
    "single workers' stale gradients one by one (ASP, R2SP, ElasticBSP between barriers) can "
    "dip or diverge in some runs, while BSP and LB-BSP apply the average of every worker's "
    "gradient. Use --repeats 3 or more to see how often; --lr 0.1 compares speed alone.",
    "SSP, DSSP and ElasticBSP run with --optimizer dynsgd by default here (config.json of each "
    "run and compare.json's policy_optimizers record it; an --optimizer given applies to every "
    "policy). ElasticBSP with sgd reached 95% in 2 of 3 seeds, with dynsgd in 3 of 3 and "
    "sooner. With plain sgd at lr 0.3 under a steady straggler, SSP reached 95% in 1 of 3 "
    "seeds (live: one diverged, one plateaued, one collapsed after reaching it; simulated "
    "alike) and DSSP was slow or fell short: the staleness bound binds at every push of the "
    "straggler, which releases the other workers together; they compute from one server "
    "version and the arrival-mode server applies each of their gradients at the full lr, "
    "together with the straggler's own, a round stale (staleness 0, 1, 2 and 3 in every round "
    "of 4 pushes): four full steps per round where BSP applies one averaged step (BSP at lr "
    "1.2 failed in 2 of 3 simulated seeds too). dynsgd applies the k-th push of such a round "
    "at lr / (k + 1), about 2x BSP's step in all; both then reached 95% in every repeat.",
    "Which straggler SSP beats BSP under: with a persistent one (one-slow) the fast workers "
    "are paced by it once they are `staleness` steps ahead, so SSP trains as many samples per "
    "second as BSP and waits as much; a time to target below BSP's there comes from its larger "
    "per-round step, not from waiting less. With transient stragglers (random) it waits less "
    "than BSP, whose every round waits for the slowest worker of that round: about 1.5x BSP's "
    "samples per second; how much of that becomes time to target varies by repeat (the "
    "evaluations, every 0.5 s, bound the resolution).",
]

# `compare ... -- CMD`: the flags of the built-in task that a user's script, which builds its
# own model and data and evaluates itself, has no use for (dest -> flag, and why).
SCRIPT_REFUSED = {
    "model": ("--model", "the script builds its own model"),
    "model_opt": ("--model-opt", "the script builds its own model"),
    "model_size": ("--model-size", "the script builds its own model"),
    "dataset": ("--dataset", "the script loads its own data"),
    "data_dir": ("--data-dir", "the script loads its own data"),
    "dataset_opt": ("--dataset-opt", "the script loads its own data"),
    "epochs": ("--epochs", "the job does not know the script's data set size: give --steps "
                           "(per worker) or --max-seconds"),
    "eval_interval": ("--eval-interval", "the script evaluates itself: "
                                         "opt.report(test_accuracy=...)"),
    "threads": ("--threads", "set torch.set_num_threads in the script"),
    "compress": ("--compress", "not wired for scripts"),
    "compress_opt": ("--compress-opt", "not wired for scripts"),
    "compress_variant": ("--compress-variant", "not wired for scripts"),
    "push_range": ("--push-range", "not wired for scripts"),
    "schedule": ("--schedule", "not wired for scripts"),
    "device": ("--device", "the script puts its model on its device (model.cuda())"),
    "amp": ("--amp", "the script runs its forward under torch.autocast itself"),
    "link": ("--link", "not wired for scripts"),
    "restart_workers": ("--restart-workers", "not wired for scripts"),
    "restart_servers": ("--restart-servers", "not wired for scripts"),
    "checkpoint_dir": ("--checkpoint-dir", "not wired for scripts"),
    "checkpoint_every": ("--checkpoint-every", "not wired for scripts"),
    "checkpoint_seconds": ("--checkpoint-seconds", "not wired for scripts"),
}
SCRIPT_NOTES = [
    "Each run started the script once per worker (paramserver launch's machinery: "
    "DistributedOptimizer times each step's compute and stretches it by the scenario's "
    "straggler factor and --device-time, so the policies see the slowness as in train).",
    "Every policy gets the same sample budget (--steps per worker x --batch-size x workers); "
    "the test metric is the one the script reported with opt.report(test_accuracy=...), "
    "timed when the coordinator received it.",
]
ELASTIC_NOTE = (
    "An elastic comparison (--workers MIN:MAX): every run starts with MIN workers and MAX - MIN "
    "more join it through its join address (`paramserver worker --join`, as by hand) at the "
    "same point, --join-at (seconds of training, or a share of the sample budget: the same work "
    "under every policy; a joiner registers once its process is up, seconds later on a busy "
    "host, and its worker_joined event's `samples` says where it landed); each run's membership "
    "timeline shows the joins and the --batch-rule's "
    "terms after them. The single-process reference trains at the global batch the runs start "
    "with (MIN workers').")
USAGE_SCRIPT = ("compare's script form: paramserver compare --sync bsp,lbbsp --steps 200 -- "
                "python my_script.py")


def script_command(args) -> list[str]:
    """The worker command given after `--` ([] for the built-in task). A script run refuses
    the built-in task's flags that were given (ValueError naming them), needs a budget it can
    share between policies, and a shard count."""
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    elif command:
        raise ValueError(f"unexpected arguments {' '.join(command)!r}; a script to compare "
                         f"goes after '--' ({USAGE_SCRIPT})")
    if not command:
        return []
    given = [(flag_, why) for dest, (flag_, why) in SCRIPT_REFUSED.items()
             if getattr(args, dest) != args.parser_defaults.get(dest)]
    if given:
        raise ValueError("; ".join(f"{f} does not apply to a script run ({why})"
                                   for f, why in given))
    if args.steps is None and args.max_seconds is None:
        raise ValueError("a script run needs a budget every policy gets alike: --steps N "
                         "(per worker, at --batch-size) or --max-seconds S")
    if args.servers == flag.AUTO:
        raise ValueError("--servers auto needs the built-in model's size; give a count for a "
                         "script run")
    from paramserver.cli.launch_cmd import worker_command
    return worker_command(command)


def rule_pairing(given: str | None) -> tuple[str, dict[str, str]]:
    """(the base update rule, policy -> its own rule): an --optimizer given names the rule of
    every run; without one, DEFAULTS' rule with the policies' paired rules."""
    return (given, {}) if given else (DEFAULTS.optimizer, paired_optimizers())


def paired_text(pairs: dict[str, str] | None = None) -> str:
    """'dynsgd for ssp and dssp': the pairing in words."""
    rules: dict[str, list[str]] = {}
    for policy, rule in (paired_optimizers() if pairs is None else pairs).items():
        rules.setdefault(rule, []).append(policy)
    return "; ".join(f"{r} for {' and '.join(ps)}" for r, ps in rules.items())


def policy_sync_options(pairs) -> dict[str, dict]:
    """--sync-opt values ((policy, key, value), as flag.policy_option parses each, or the
    POLICY.KEY=VALUE text) into {policy: {key: value}}."""
    out: dict[str, dict] = {}
    for pair in pairs or []:
        if isinstance(pair, str):
            try:
                pair = flag.policy_option(pair)
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"--sync-opt {exc}") from None
        policy, key, value = pair
        out.setdefault(policy, {})[key] = value
    return out


def check_policy_options(options: dict[str, dict], policies: list[str],
                         batch_size: int) -> None:
    """Refuse, before any run starts, --sync-opt for a policy the comparison does not run and
    options a policy does not take (ValueError naming them)."""
    from paramserver.policies import make_policy
    for policy, opts in options.items():
        if policy not in policies:
            # auto runs its candidates with its own settings: say which of them is its
            auto = (" (auto runs ssp at its own bound: auto.staleness=N)"
                    if "auto" in policies and policy == "ssp" else "")
            raise ValueError(f"--sync-opt names {policy}, which this comparison does not run "
                             f"(--sync {','.join(policies)}): add {policy} to --sync or drop "
                             f"its option{auto}")
        make_policy(policy, batch_size, **opts)


def _variant(spec: str) -> tuple[str, str, dict]:
    """One `--compress-variant` ([LABEL=]NAME[:KEY=VALUE...]) into (label, name, options).

    The label names the run's row in the report (default: the spec with ':' as '-')."""
    label, sep, body = spec.partition("=") if "=" in spec.split(":", 1)[0] else ("", "", spec)
    name, *pairs = [p.strip() for p in body.split(":")]
    if not name:
        raise ValueError(f"--compress-variant {spec!r} names no compressor")
    label = label.strip() or "-".join([name, *pairs])
    if "/" in label:
        raise ValueError(f"--compress-variant label {label!r} holds '/'")
    return label, name, parse_options(pairs, "compress")


compress_variant = flag._typed(_variant, "compress_variant")


def parse_variants(specs) -> dict[str, tuple[str, dict]]:
    """`--compress-variant` values (texts, or what compress_variant made of them) into
    label -> (name, options); a label may be given once."""
    out: dict[str, tuple[str, dict]] = {}
    for spec in specs or []:
        label, name, options = _variant(spec) if isinstance(spec, str) else spec
        if label in out:
            raise ValueError(f"--compress-variant label {label!r} is repeated")
        out[label] = (name, options)
    return out


def _policies(arg: str | None) -> list[str]:
    from paramserver.policies import SYNC_POLICIES
    names = SYNC_POLICIES.names() if not arg else [p.strip() for p in arg.split(",") if p.strip()]
    for name in names:
        SYNC_POLICIES.get(name)  # unknown names fail with the known ones listed
    return names


class ScheduledJoins:
    """The joiners of one run of an elastic comparison: workers MIN..MAX-1, each started as
    `paramserver worker --join ADDR` would be by hand (LocalCluster.add_worker), once `join_at`
    is due, judged from the run's metrics.jsonl as it grows. Called at every poll of the run."""

    def __init__(self, metrics_path: Path, join_at: JoinAt, first: int, last: int):
        from paramserver.runlog.progress import MetricsTail
        self.tail = MetricsTail(metrics_path)
        self.join_at, self.slots = join_at, range(first, last)
        self.joined_at: float | None = None  # seconds of training when they were started

    def __call__(self, cluster) -> None:
        if self.joined_at is not None or not self.slots:
            return
        tail = self.tail
        tail.poll()
        if not tail.steps:  # training has not begun: nothing to join yet
            return
        spec = cluster.spec
        if self.join_at.due(tail.t, tail.samples, spec.max_samples, spec.max_seconds):
            for slot in self.slots:
                cluster.add_worker(slot)
            self.joined_at = tail.t


def joins_for(cfg: TrainConfig, folder: Path, join_at: JoinAt) -> ScheduledJoins | None:
    """The scheduled joins of a run of `cfg` (None unless it is elastic with MAX > MIN)."""
    if not cfg.min_workers or cfg.workers <= cfg.min_workers:
        return None
    return ScheduledJoins(folder / "metrics.jsonl", join_at, cfg.min_workers, cfg.workers)


def _write_plan(out: Path, args, base, scenarios, policies, done: list[dict]) -> None:
    script = getattr(args, "worker_command", None)
    if script:
        from paramserver.cli.launch_cmd import script_settings
    plan = {"scenarios": {k: {"straggler": s, "description": d} for k, (s, d) in scenarios.items()},
            "policies": policies, "repeats": args.repeats, "target_accuracy": args.target,
            "single_reference": not args.no_single,
            # The report's settings table shows this: a script run names its command there.
            "config": {**script_settings(base), "command": " ".join(script)} if script
            else base.as_dict(),
            # The rules that replace config.optimizer for these policies (each run's config.json
            # has the one it ran with).
            "policy_optimizers": {p: r for p, r in args.policy_optimizers.items()
                                  if p in policies and r != base.optimizer},
            "notes": (SCRIPT_NOTES if script else NOTES)
            + ([ELASTIC_NOTE] if base.min_workers else []),
            "runs": done, "command": " ".join(sys.argv)}
    if base.min_workers:  # the membership change every run goes through
        plan["elastic"] = {"min_workers": base.min_workers, "max_workers": base.workers,
                           "join_at": args.join_at.text(), "batch_rule": base.batch_rule}
    if script:
        plan["worker_command"] = script
    (out / "compare.json").write_text(json.dumps(plan, indent=2))


def _run_all(runs, out, args, base, scenarios, policies, console) -> list[dict]:
    from paramserver.cli.launch_cmd import run_script
    from paramserver.launch.jobs import run_training
    from paramserver.launch.local import LaunchError
    command = getattr(args, "worker_command", None)

    def run_one(cfg, folder, quiet, timeout) -> dict:  # the user's script, or the built-in task
        watch = joins_for(cfg, folder, args.join_at)
        if command:
            return run_script(cfg, folder, command, quiet=quiet, timeout=timeout, watch=watch,
                              launcher=args.launcher_spec)
        return run_training(cfg, folder, quiet=quiet, timeout=timeout, watch=watch,
                            launcher=args.launcher_spec)
    done: list[dict] = []
    for i, run in enumerate(runs, 1):
        label = f"[{i}/{len(runs)}] {run.scenario} / {run.policy} / rep {run.repeat}"
        console.print(f"{label} ...")
        t0 = time.perf_counter()
        try:
            s = run_one(run.config, run.folder, quiet=args.quiet, timeout=args.run_timeout)
        except LaunchError as exc:
            first, *rest = str(exc).splitlines() or [""]
            console.print(f"  [red]failed[/red]: {first}", markup=True)
            for line in [r for r in rest if r.strip()][-3:]:  # the end of its output
                console.print(f"    {line}", markup=False, highlight=False)
            console.print(f"  logs: {run.folder / 'logs'}", highlight=False)
            done.append({"folder": str(run.folder), "ok": False, "error": str(exc)[:500]})
            continue
        finally:
            _write_plan(out, args, base, scenarios, policies, done)
        target, tta = _time_to_target(s, run.folder, args.target)
        diverged = s.get("diverged_at_s")
        auc = s.get("final_test_auc")  # a click model (dlrm) is scored by AUC
        acc = s["final_test_accuracy"]
        console.print(("  acc -, no evaluation reported" if acc is None else f"  acc {acc:.4f}")
                      + ("" if auc is None else f", AUC {auc:.4f}") + f", time to {target}: "
                      f"{'not reached' if tta is None else f'{tta:.1f} s'}, wait "
                      f"{s['mean_wait_fraction']:.0%} ({time.perf_counter() - t0:.0f} s)"
                      + ("" if diverged is None else
                         f", [red]diverged[/red] (test loss not finite from {diverged:.1f} s)"))
        done.append({"folder": str(run.folder), "ok": True})
        _write_plan(out, args, base, scenarios, policies, done)
    return done


def _time_to_target(summary: dict, folder: Path, target: float | None
                    ) -> tuple[str, float | None]:
    """(what the target is, seconds until the run reached it): test accuracy, or the test AUC
    for a click model; `target` None is the score's default."""
    from paramserver.report.collect import SCORES, fmt_target
    from paramserver.runlog.metrics import (
        evaluations, read_records, time_to_accuracy, time_to_auc,
    )
    score = "accuracy" if summary.get("final_test_auc") is None else "auc"
    target = SCORES[score][1] if target is None else target
    known = summary["time_to_auc" if score == "auc" else "time_to_accuracy"]
    if f"{target:g}" not in known:  # a target off the summary's list: from the records
        evals = evaluations(read_records(folder / "metrics.jsonl"))
        known = (time_to_auc if score == "auc" else time_to_accuracy)(evals, (target,))
    return fmt_target(score, target), known[f"{target:g}"]


def _run(args) -> int:
    from rich.console import Console

    from paramserver.compression.wire import WireSpec
    console = Console(stderr=False, quiet=False)
    if flag.check_observe_args(args, "compare"):  # (its runs go one after another)
        return 2
    try:
        args.worker_command = script_command(args)
        if args.join_at is None:
            args.join_at = THIRD
        elif not getattr(args.workers, "elastic", False):
            raise ValueError("--join-at applies to an elastic comparison: give --workers "
                             "MIN:MAX")
        policies = _policies(args.sync)
        scenarios = parse_scenarios(args.scenario, read_trace)
        args.optimizer, args.policy_optimizers = rule_pairing(args.optimizer)
        args.launcher_spec = launcher_from_args(args)
        if args.launcher != "local" and getattr(args.workers, "elastic", False):
            raise ValueError("--workers MIN:MAX (scheduled joins) needs the local launcher; "
                             "compare a fixed worker count across a Ray cluster")
        base = config_from_args(args, sync="bsp", sync_options={})
        if base.servers == flag.AUTO:  # one count for every run of the comparison
            base = resolve_servers(base)
        base.validate()
        check_model_size(base)
        out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-compare")
        variants = parse_variants(args.compress_variant)
        for name, opts in variants.values():
            # unknown names and options fail before any run (pruners or codecs: bf16, uniform8)
            WireSpec.parse(name, *variant_settings(opts, base.pull_compress, base.pull_refresh))
        policy_options = policy_sync_options(args.sync_opt)
        check_policy_options(policy_options, policies, base.batch_size)
        runs = plan_runs(base, policies, scenarios, args.repeats, out, single=not args.no_single,
                         policy_options=policy_options, variants=variants,
                         policy_optimizers=args.policy_optimizers)
        if variants:
            policies = list(dict.fromkeys(r.policy for r in runs if r.policy != SINGLE))
        for r in runs:  # every scenario fits the job before the first run starts
            try:
                check_named_ranks(r.config)
            except ValueError as exc:
                raise ValueError(f"scenario {r.scenario}: {exc}") from None
        for c in {(r.config.sync, r.config.optimizer, r.config.compress): r.config
                  for r in runs if r.policy != SINGLE}.values():
            check_pushes_fit_rule(c)  # every policy takes its pushes, before the first run
    except ValueError as exc:
        print(f"paramserver compare: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    single = "" if args.no_single else " + single-process reference"
    console.print(f"comparing {', '.join(policies)}{single} on {', '.join(scenarios)}, "
                  f"{args.repeats} repeat(s): {len(runs)} runs into {out}"
                  + (f", each running {' '.join(args.worker_command)} as the workers"
                     if args.worker_command else ""))
    if base.min_workers and base.workers > base.min_workers:
        joiners = base.workers - base.min_workers
        console.print(f"each run starts {base.min_workers} workers; {joiners} more join "
                      f"{args.join_at.describe()} (batch rule {base.batch_rule})")
    code = 0
    try:
        _run_all(runs, out, args, base, scenarios, policies, console)
    except KeyboardInterrupt:
        console.print("interrupted: the finished runs are kept; drawing the report from them")
        code = 130
    except ValueError as exc:
        print(f"paramserver compare: {exc}", file=sys.stderr)
        return 2
    from paramserver.report import build_report
    from paramserver.report.collect import ReportError
    try:
        report = build_report(out)
    except ReportError as exc:  # every run failed: their errors are printed above
        print(f"paramserver compare: no report: {exc}", file=sys.stderr)
        return code or 1
    except KeyboardInterrupt:  # the runs are whole: only the page is missing
        print(f"paramserver compare: interrupted while drawing the report; the runs are kept "
              f"in {out} (paramserver report {out} draws it)", file=sys.stderr)
        return 130
    from paramserver.report import VERDICT_TXT
    # The answer on the console too: the page's verdict, a paragraph per scenario.
    console.print((out / VERDICT_TXT).read_text(encoding="utf-8").rstrip(), markup=False,
                  highlight=False)
    console.print(f"report: {report}")
    from paramserver.report.html import ADVISE_LINE
    console.print(ADVISE_LINE)
    return code


# The one-line help of each command here (cli.main lists them without building parsers).
SUMMARY = {"compare": "train under each sync policy side by side and write a report"}


def register(sub) -> None:
    p = sub.add_parser(
        "compare", help=SUMMARY["compare"],
        description="Run the same training under several sync policies (default: all) and "
                    "straggler scenarios, with repeats, plus a single-process reference at the "
                    "same global batch; write every run's logs and report.html into one folder. "
                    "Built-in scenarios: "
        f"{', '.join(f'{k} ({v[1]})' for k, v in SCENARIOS.items())}. "
        "With '-- COMMAND' (e.g. -- python my.py), every run starts COMMAND once per worker "
        "as `paramserver launch` does, instead of the built-in model: the script joins with "
        "paramserver.DistributedOptimizer, reports its test metric with "
        "opt.report(test_accuracy=...) (the time to target is taken from it), and the "
        "scenario's straggler stretches its measured step time. A script run needs --steps "
        "or --max-seconds; the built-in model's flags (--model, --dataset, --epochs, "
        "--eval-interval, ...) are refused. "
        "With --workers MIN:MAX every run starts MIN workers and MAX - MIN join it at "
        "--join-at, through the join address as `paramserver worker --join` does: the "
        "report compares the policies under that membership change, each run's timeline "
        "showing it.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sync", help=f"comma-separated policies (default all: "
                                  f"{','.join(catalog.SYNC_POLICIES)})")
    p.add_argument("--sync-opt", action="append", metavar="POLICY.KEY=VALUE",
                   type=flag.policy_option,
                   help="a policy option, e.g. ssp.staleness=2 (repeatable)")
    p.add_argument("--scenario", action="append", metavar="NAME|NAME=SPEC",
                   help="straggler scenario (repeatable; default one-slow)")
    p.add_argument("--repeats", type=flag.positive_int, default=2,
                   help="repeats per run, seeds seed..seed+k-1; the verdict calls policies "
                        "whose repeats' times overlap a tie (default 2)")
    p.add_argument("--target", type=flag.accuracy,
                   help="target test accuracy (default 0.95), or test AUC for a click model "
                        "such as dlrm (default 0.7)")
    p.add_argument("--compress-variant", action="append", metavar="[LABEL=]NAME[:KEY=VALUE...]",
                   type=compress_variant,
                   help="run every policy once per push format instead of with --compress: "
                        "a pruner or a codec with its options, e.g. "
                        "topk:fraction=0.01:error_feedback=false, bf16, powersgd:rank=4, "
                        "topk:fraction=0.01:codec=bf16; pull=CODEC and pull_refresh=N set the "
                        "variant's --pull-compress and --pull-refresh (e.g. "
                        "8bit=uniform8:pull=uniform8); rows are named POLICY+LABEL "
                        "(repeatable)")
    p.add_argument("--no-single", action="store_true", help="skip the single-process reference")
    p.add_argument("--join-at", type=flag.join_at, default=None, metavar="SECONDS|N%",
                   help="with --workers MIN:MAX: when MAX - MIN workers join each run (through "
                        "its join address, as `paramserver worker --join` by hand): after "
                        "SECONDS of training (e.g. 20s) or at N%% of the sample budget (the same "
                        "work under every policy; default 33%%, a third of the way)")
    g = add_training_args(p, DEFAULTS, optimizer_default=f"{DEFAULTS.optimizer}, and "
                          f"{paired_text()}; a rule given applies to every policy")
    g["run"].add_argument("--out", type=flag.out_folder,
                          help="output folder (default runs/<time>-compare)")
    g["run"].add_argument("--quiet", action="store_true", help="no per-run progress bar")
    add_launcher_args(g["cluster"])
    g["run"].add_argument("--run-timeout", type=flag.positive_seconds, default=900.0,
                          help="give up on one run after this many seconds (default 900)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="your training script, run as the workers of every run (see above)")
    p.set_defaults(func=_run, parser_defaults={d: p.get_default(d) for d in SCRIPT_REFUSED})
