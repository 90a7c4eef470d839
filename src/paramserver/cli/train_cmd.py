"""`paramserver train`: one training job on this machine, with a progress bar and a run folder."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.cli import catalog
from paramserver.cli.config_args import config_from_args
from paramserver.core.keyspace import AUTO_SERVERS_HELP
from paramserver.emulation.device_time import DEVICE_TIME_HELP
from paramserver.emulation.links import HELP as LINK_HELP
from paramserver.emulation.stragglers import STRAGGLER_HELP
from paramserver.policies.batch_rule import HELP as BATCH_RULE_HELP
from paramserver.spec.config import TrainConfig
from paramserver.spec.job import AMP_MODES, SCHEDULES
from paramserver.core.bounded import json_value
from paramserver.spec.run_job import RunJob

# Only what --help needs is imported above; torch, the launchers and the registries load when
# a command runs (see tests/spec/test_cli_help.py).

EPILOG = f"""--link [TARGET=]RATE[,LATENCY]
{LINK_HELP}

--straggler SPEC
{STRAGGLER_HELP}

--device-time SPEC
{DEVICE_TIME_HELP}

Durations (--heartbeat-timeout, --max-seconds, --eval-interval, --checkpoint-seconds,
--timeout) are seconds, or a number with a unit: 90s, 1500ms."""


GROUPS = (("job", "the job: workers, shards, budget"),
          ("policy", "sync policy and update rule"),
          ("model", "model, data and device"),
          ("network", "network and compression"),
          ("faults", "stragglers, faults and checkpoints"),
          ("observe", "observability"),
          ("cluster", "cluster: where the processes run"),
          ("run", "this run"))


def add_training_args(p, d: TrainConfig | None = None, optimizer_default: str | None = None,
                      policy_flags=None) -> dict:
    """The options shared by `train` and `compare`, in help groups by topic; `d` holds the
    defaults shown and used. Returns the groups {name: argparse group} for the caller's own
    flags; `policy_flags(group)`, if given, adds the caller's policy flags first in theirs.

    optimizer_default, if given, is what --optimizer's help says its default is, and the flag
    then defaults to None (the caller picks the rule per policy)."""
    d = d or TrainConfig()
    g = {name: p.add_argument_group(title) for name, title in GROUPS}
    if policy_flags is not None:
        policy_flags(g["policy"])
    g["job"].add_argument("--workers", type=flag.workers, default=d.workers, metavar="N|MIN:MAX",
                   help=f"workers; MIN:MAX makes the job elastic: it starts with MIN, a worker "
                        f"started by hand (PARAMSERVER_KEYS=RUN/keys paramserver worker --join "
                        f"$(cat RUN/coordinator.addr)) joins at any time up to MAX (more are "
                        f"refused), training waits while fewer than MIN are left, a worker "
                        f"sent SIGTERM finishes its step and leaves (default {d.workers})")
    g["job"].add_argument("--batch-rule", type=flag.batch_rule, default=d.batch_rule,
                   help=f"elastic jobs: {BATCH_RULE_HELP} (default {d.batch_rule})")
    g["job"].add_argument("--servers", type=flag.servers, default=d.servers,
                   help=f"shards, or {AUTO_SERVERS_HELP}, or MIN:MAX: start MIN, let servers "
                        f"join (`paramserver server --join`) up to MAX and be drained "
                        f"(`paramserver drain`) back to MIN while training runs; key ranges "
                        f"move to balance bytes and load, sparse-table rows and --replicas "
                        f"backups with them (default {d.servers})")
    g["model"].add_argument("--model", default=d.model,
                   help=f"{catalog.listed(catalog.MODELS)} (default {d.model})")
    g["model"].add_argument("--model-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="model option, e.g. hidden=256 for mlp; dim=16, row_budget=100000, "
                        "admit_after=2, table_lr=0.05 for dlrm (repeatable)")
    g["model"].add_argument("--model-size", type=flag.model_size, metavar="COUNT",
                   help="parameters of a model sized by count (wide: the hidden width is "
                        "picked to match), e.g. 1e8, 500M, 1G")
    g["model"].add_argument("--dataset", default=d.dataset,
                   help=f"{catalog.listed(catalog.DATASETS)} (default {d.dataset})")
    g["model"].add_argument("--data-dir", help="folder with the MNIST IDX files (for --dataset mnist)")
    g["model"].add_argument("--dataset-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="dataset option, e.g. samples=20000 for synthetic (repeatable)")
    g["job"].add_argument("--epochs", type=flag.positive_number, default=d.epochs, action=flag.Given,
                   help=f"passes over the training set, all workers together (default {d.epochs:g})")
    g["job"].add_argument("--steps", type=flag.positive_int,
                          help="steps per worker instead of --epochs: a budget of steps x "
                               "--batch-size x workers samples, which the workers share (an "
                               "elastic job's is MAX workers' worth: with fewer running, each "
                               "takes more steps)")
    g["job"].add_argument("--max-seconds", type=flag.positive_seconds,
                   help="stop after this much training time")
    g["job"].add_argument("--batch-size", type=flag.positive_int, default=d.batch_size,
                   help=f"samples per worker step (default {d.batch_size})")
    g["policy"].add_argument("--lr", type=flag.positive_number, default=d.lr,
                             help=f"learning rate (default {d.lr})")
    g["policy"].add_argument("--optimizer", default=d.optimizer if optimizer_default is None else None,
                   help=f"server update rule: {catalog.listed(catalog.UPDATE_RULES)} "
                        f"(default {optimizer_default or d.optimizer})")
    g["policy"].add_argument("--optimizer-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="update-rule option, e.g. momentum=0.9 (repeatable)")
    g["network"].add_argument("--compress", default=d.compress,
                   help=f"gradient pruning: {catalog.listed(catalog.COMPRESSORS)}, or a value "
                        f"codec for dense pushes: {catalog.listed(catalog.CODECS)}, "
                        f"or auto: each worker by its --link rate, or its share of the "
                        f"servers' (>= 10 Gbit/s or no --link dense, >= 1 Gbit/s bf16, slower "
                        f"uniform8; tensors under 4096 values stay float32 inside the push "
                        f"(codec mixed: inner=CODEC, dense_below=N); dense without a tensor of "
                        f"4096 values or more; options dense_below, dense_at, bf16_at, "
                        f"slow=uniform8|topk, fraction) (default {d.compress})")
    g["network"].add_argument("--compress-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="pruning or codec option, e.g. fraction=0.01, k=2, "
                        "error_feedback=false, block=64; a pruner's values through a codec: "
                        "codec=bf16 (its options: codec.KEY=VALUE) (repeatable)")
    g["network"].add_argument("--pull-compress", default=d.pull_compress, metavar="CODEC",
                   help=f"pull the change since the last pull, encoded by a codec: "
                        f"{catalog.listed(catalog.CODECS)}; none pulls dense "
                        f"(default {d.pull_compress}; float32 jobs)")
    g["network"].add_argument("--pull-refresh", type=flag.positive_int, default=d.pull_refresh,
                   metavar="N", help=f"with --pull-compress, every Nth pull is dense, which "
                                     f"ends the drift (default {d.pull_refresh})")
    g["network"].add_argument("--push-range", default=d.push_range, help=catalog.PUSH_RANGE_HELP)
    g["network"].add_argument("--schedule", default=d.schedule, choices=SCHEDULES,
                   help="per-layer requests: push each layer's gradient as backward produces "
                        "it and pull layers in the order fifo, lifo or stalest (stalest layer "
                        f"first); off pushes and pulls the whole model (default {d.schedule})")
    g["model"].add_argument("--device", default=d.device, choices=("cpu", "cuda", "auto"),
                   help="where each worker's model computes: cpu, cuda (its flat buffers on "
                        "the GPU, pinned host copies for the wire; an error without CUDA) or "
                        f"auto (cuda if available, else cpu) (default {d.device})")
    g["model"].add_argument("--amp", default=d.amp, choices=AMP_MODES,
                   help="mixed precision: forward and loss under torch.autocast in bf16 or "
                        "fp16 (fp16 scales the loss with torch.amp.GradScaler; a step whose "
                        "gradient overflowed pushes zeros); the parameters and what the servers "
                        f"hold stay float32 (default {d.amp})")
    g["network"].add_argument("--link", action="append", metavar="[TARGET=]RATE[,LATENCY]", type=flag.link,
                   help="emulated network link (repeatable; grammar below), e.g. 100mbit for "
                        "every worker, w2=10mbit,5ms for worker 2, s0=1gbit for server 0")
    g["faults"].add_argument("--straggler", default=d.straggler, type=flag.straggler,
                   help=f"slowness injected per worker, e.g. 1:3 (default {d.straggler}; "
                        f"grammar below)")
    g["faults"].add_argument("--device-time", default=d.device_time, type=flag.device_time,
                   help=f"emulated compute time per sample, e.g. 2ms "
                        f"(default {d.device_time.text()}; "
                        f"see below)")
    g["job"].add_argument("--seed", type=flag.count, default=d.seed,
                   help=f"random seed (default {d.seed})")
    g["model"].add_argument("--threads", type=flag.positive_int, default=d.threads,
                   help=f"torch threads per worker (default {d.threads}: workers share the cores)")
    g["observe"].add_argument("--eval-interval", type=flag.seconds, default=d.eval_interval,
                   help=f"seconds between test evaluations; 0 runs no evaluator "
                        f"(default {d.eval_interval:g})")
    g["model"].add_argument("--dtype", default=d.dtype, choices=("float32", "float64"),
                   help="float32 or float64 parameters")
    g["faults"].add_argument("--heartbeat-timeout", type=flag.positive_seconds, default=d.heartbeat_timeout,
                   help=f"seconds of silence before a worker is declared dead "
                        f"(default {d.heartbeat_timeout:g})")
    g["observe"].add_argument("--stall-timeout", type=flag.positive_seconds, default=d.stall_timeout,
                   help="seconds without a completed step after which the coordinator writes "
                        "RUN/stall-N.txt (who is missing, what each member waits for, every "
                        "member's stack; `paramserver doctor RUN` prints it) (default: 10 x "
                        "the median step time, at least 3 s or half the heartbeat timeout, "
                        "whichever is less; 10 x that floor until the first step ends)")
    g["network"].add_argument("--max-message-bytes", type=flag.size, metavar="SIZE",
                   help="the largest frame a shard server accepts, e.g. 64MB; a larger one "
                        "disconnects its sender before it is read (default: the job's largest "
                        "legitimate frame plus headroom, from the model size)")
    g["faults"].add_argument("--restart-workers", type=flag.count, default=d.restart_workers,
                   help="replace up to N workers that die; a replacement takes the dead one's "
                        f"rank and data shard and rejoins (default {d.restart_workers})")
    g["faults"].add_argument("--restart-servers", type=flag.count, default=d.restart_servers,
                   help="restart up to N servers that die, from the latest usable checkpoint "
                        "at the same address (the initial parameters before the first one; "
                        "needs --checkpoint-every or --checkpoint-seconds; the updates lost "
                        "since are counted in summary.json). With 0, a server's "
                        f"death stops the job (default {d.restart_servers})")
    g["faults"].add_argument("--replicas", type=int, choices=(1, 2), default=d.replicas,
                   help="copies of each shard: 2 runs a backup beside each shard server, which "
                        "every update reaches before it is acknowledged and which takes over, "
                        "with no update lost, when the primary dies (a new backup is then "
                        "rebuilt from the survivor); twice the server processes; exclusive "
                        f"with --restart-servers (default {d.replicas})")
    g["faults"].add_argument("--restart-coordinator", type=flag.count, default=d.restart_coordinator,
                   help="restart a coordinator that dies, up to N times, at the same address: "
                        "it takes back the live servers and workers without restarting them "
                        "(with checkpoints, it also reads the latest one); members then wait "
                        "up to 30 s for it, not 1.5 heartbeat timeouts. With 0, the "
                        f"coordinator's death stops the job (default {d.restart_coordinator})")
    g["faults"].add_argument("--checkpoint-dir", help="save checkpoints here (default: none)")
    g["faults"].add_argument("--checkpoint-every", type=flag.positive_int,
                   help="checkpoint every N rounds (BSP, LB-BSP) or N worker steps (others; "
                        "under auto a lockstep round counts one)")
    g["faults"].add_argument("--checkpoint-seconds", type=flag.positive_seconds,
                   help="checkpoint every N seconds")
    flag.add_observe_args(g["observe"])
    return g


def print_summary(s: dict, run_dir: Path) -> None:
    acc = s["final_test_accuracy"]
    tta = ", ".join(f"{k}: {'-' if v is None else f'{v:.1f}s'}"
                    for k, v in s["time_to_accuracy"].items())
    print(f"{s['sync']}: {s['steps']} steps in {s['wall_time_s']:.1f} s, final test accuracy "
          f"{'-' if acc is None else f'{acc:.4f}'}, mean wait {s['mean_wait_fraction']:.1%}")
    print(f"  time to accuracy: {tta}")
    if s.get("final_test_auc") is not None:  # a click model (dlrm)
        tt_auc = ", ".join(f"{k}: {'-' if v is None else f'{v:.1f}s'}"
                           for k, v in s["time_to_auc"].items())
        print(f"  test AUC: final {s['final_test_auc']:.4f}, best {s['best_test_auc']:.4f}; "
              f"time to AUC: {tt_auc}")
    if s.get("diverged_at_s") is not None:
        print(f"  diverged: the test loss is not a finite number from {s['diverged_at_s']:.1f} s "
              f"on (try a smaller --lr, or --optimizer dynsgd for asynchronous policies)")
    if s.get("server_restarts"):
        print(f"  servers restarted from a checkpoint: {s['server_restarts']}, "
              f"updates lost: {s['lost_updates']}")
    if s.get("workers_died"):  # the job went on without them: say so, not only in the logs
        print(f"  workers that died during the job: {s['workers_died']} (the others went on; "
              f"--restart-workers N replaces dead workers)")
    if s.get("coordinator_restarts"):
        print(f"  coordinator restarted, live servers and workers taken back: "
              f"{s['coordinator_restarts']}")
    if s.get("late_pushes"):
        print(f"  pushes dropped as late (workers joining a closing round): {s['late_pushes']}")
    line = unbalanced_line(s)
    if line:
        print(line)
    print(f"  run folder: {run_dir}")


def unbalanced_line(s: dict) -> str | None:
    """A line about the shards' load when the busiest one was busy more than UNBALANCED times
    the mean, else None."""
    from paramserver.runlog.metrics import UNBALANCED
    imbalance = s.get("shard_imbalance")
    if imbalance is None or imbalance <= UNBALANCED:
        return None
    shares = ", ".join(
        f"{rank}: " + ("-" if v["busy_fraction"] is None else f"{v['busy_fraction']:.0%}")
        for rank, v in s["per_shard"].items())
    return (f"  shards unbalanced: the busiest was busy {imbalance:.1f}x the shards' mean "
            f"(busy share of the wall time, by shard: {shares})")


BUDGET_OPTIONS = ("epochs", "steps", "max_seconds")


def checkpoints_of(cfg: TrainConfig, run_dir: Path) -> Path | None:
    """The checkpoint folder of a run, wherever the resume is started from: the run folder's
    own checkpoints/ (the default place, which moves and is copied with the folder: a copy
    resumed goes on from its own, not from the original's), else the one its config names
    (absolute since runs record it so; an older run's relative path is tried from here);
    None when neither holds a committed checkpoint."""
    from paramserver.runlog.checkpoint import latest
    for root in [run_dir / "checkpoints"] + \
            ([Path(cfg.checkpoint_dir)] if cfg.checkpoint_dir else []):
        if latest(root) is not None:
            return root.resolve()
    return None


def resume_plan(args, parser_defaults: dict) -> tuple[TrainConfig, Path, dict]:
    """The saved configuration of run folder `args.resume`, its budget extended from the CLI."""
    run_dir = Path(args.resume)
    try:
        doc = json_value((run_dir / "config.json").read_text())
        saved = doc["config"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot resume {run_dir}: no readable config.json ({exc})") from None
    for name in BUDGET_OPTIONS:  # a budget given on the command line replaces the saved one
        if getattr(args, name) != parser_defaults.get(name):
            saved[name] = getattr(args, name)
    cfg = TrainConfig(**saved)
    from paramserver.runlog.checkpoint_set import usable_checkpoint
    root = checkpoints_of(cfg, run_dir)
    if root is None:
        raise ValueError(f"cannot resume {run_dir}: it has no committed checkpoint "
                         f"(was it run with --checkpoint-dir?)")
    cfg.checkpoint_dir = str(root)
    job = RunJob.of(doc.get("job"))  # the job it ran: its server count resolved
    tag, warnings = usable_checkpoint(cfg.checkpoint_dir, job.servers or cfg.servers,
                                      job.dtype if doc.get("job") else cfg.dtype,
                                      num_keys=job.num_keys or None)
    for warning in warnings:
        print(f"paramserver train: {warning}", file=sys.stderr)
    if tag is None:
        raise ValueError(f"cannot resume {run_dir}: no kept checkpoint in "
                         f"{cfg.checkpoint_dir} is usable")
    return cfg, run_dir, {"dir": cfg.checkpoint_dir, "tag": tag}


def _run(args) -> int:
    from paramserver.launch.jobs import run_training
    from paramserver.launch.local import LaunchError
    if flag.check_observe_args(args, "train"):
        return 2
    try:
        resume = None
        if args.resume:
            cfg, run_dir, resume = resume_plan(args, args.parser_defaults)
        else:
            cfg = config_from_args(args)
            if args.write_job:
                return _write_job(cfg, Path(args.write_job))
            run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{args.sync}")
            if cfg.checkpoint_dir is None and (cfg.checkpoint_every or cfg.checkpoint_seconds):
                cfg.checkpoint_dir = str(run_dir / "checkpoints")
        summary = run_training(cfg, run_dir, quiet=args.quiet, timeout=args.timeout,
                               resume=resume, launcher=launcher_from_args(args))
    except (ValueError, FileNotFoundError) as exc:
        print(f"paramserver train: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"paramserver train: the job failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"paramserver train: interrupted; {run_dir} keeps the steps done (summary.json, "
              f"and model.pt when the servers answered)", file=sys.stderr)
        return 130
    print_summary(summary, run_dir)
    return 0


def _write_job(cfg: TrainConfig, path: Path) -> int:
    """The job of `cfg`, checked as a run checks it, written as the coordinator reads it."""
    from paramserver.launch.jobs import prepare_spec
    spec = prepare_spec(cfg)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
        tmp.replace(path)  # a scheduler polling for the file never reads half of it
    except OSError as exc:
        raise ValueError(f"cannot write the job file {path}: {exc.strerror or exc}") from None
    print(f"wrote {path}: {spec.workers} workers, {spec.servers} server(s), sync "
          f"{spec.sync.name}, {spec.num_keys} keys")
    return 0


def launcher_from_args(args) -> dict:
    """Where a job's processes run, from the flags add_launcher_args adds (train, compare)."""
    if args.launcher == "local":
        return {"name": "local"}
    # Not wired through Ray yet: refuse rather than silently run without them.
    for name, used in (("--restart-servers", getattr(args, "restart_servers", 0)),
                       ("--resume", getattr(args, "resume", None)),
                       ("--restart-coordinator", getattr(args, "restart_coordinator", 0))):
        if used:
            raise ValueError(f"{name} is not supported with --launcher ray yet; "
                             f"use the local launcher for it")
    return {"name": "ray", "address": args.address,
            "resources": {"worker_cpus": args.ray_worker_cpus, "worker_gpus": args.ray_worker_gpus,
                          "server_cpus": args.ray_server_cpus}}


def add_launcher_args(p) -> None:
    p.add_argument("--launcher", choices=("local", "ray"), default="local",
                   help="where the processes run: child processes here (local, default) or "
                        "Ray actors (ray; needs paramserver[ray])")
    p.add_argument("--address", help="with --launcher ray: the Ray cluster to join (auto or "
                                     "HOST:PORT; default: start a local Ray instance)")
    p.add_argument("--ray-worker-cpus", type=float, default=1.0,
                   help="CPUs Ray reserves per worker (default 1)")
    p.add_argument("--ray-worker-gpus", type=float, default=0.0,
                   help="GPUs Ray reserves per worker (default 0)")
    p.add_argument("--ray-server-cpus", type=float, default=1.0,
                   help="CPUs Ray reserves per server (default 1)")


# The one-line help of each command here (cli.main lists them without building parsers).
SUMMARY = {"train": "train a model through the parameter server on this machine"}


def register(sub) -> None:
    p = sub.add_parser("train", help=SUMMARY["train"],
                       description="Start a coordinator, shard servers, workers and an evaluator "
                                   "on 127.0.0.1 (or as Ray actors: --launcher ray) and train. "
                                   "Writes config.json, metrics.jsonl, events.jsonl and "
                                   "summary.json into the run folder.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    def policy_flags(group) -> None:
        group.add_argument("--sync", default=TrainConfig.sync,
                           help=f"sync policy: {catalog.listed(catalog.SYNC_POLICIES)} "
                                f"(default {TrainConfig.sync}); {catalog.AUTO_HELP}")
        group.add_argument("--sync-opt", action="append", metavar="KEY=VALUE",
                           type=flag.option, help="sync-policy option, e.g. staleness=3 "
                                                  "(repeatable)")
    g = add_training_args(p, policy_flags=policy_flags)
    g["run"].add_argument("--out", type=flag.out_folder,
                          help="run folder (default runs/<time>-<sync>)")
    g["run"].add_argument("--resume", metavar="RUN_DIR",
                          help="continue the run in RUN_DIR from its newest usable checkpoint "
                               "(an unusable one is named and the previous kept one used; its "
                               "saved settings; --epochs/--steps/--max-seconds given here "
                               "extend the budget)")
    g["run"].add_argument("--write-job", metavar="FILE",
                          help="write the job file this command would run to FILE and exit, "
                               "starting nothing: for roles started by hand or by a cluster's "
                               "scheduler (`paramserver coordinator --job FILE`; "
                               "docs/multihost.md)")
    g["run"].add_argument("--quiet", action="store_true", help="no progress bar")
    g["run"].add_argument("--timeout", type=flag.positive_seconds, default=3600.0,
                          help="give up if the job has not finished after this many seconds")
    add_launcher_args(g["cluster"])
    p.set_defaults(func=_run, parser_defaults={n: p.get_default(n) for n in BUDGET_OPTIONS})
