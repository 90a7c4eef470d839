"""`paramserver launch -- CMD`: a job for your own training script, run once per worker."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.cli import catalog
from paramserver.policies.batch_rule import HELP as BATCH_RULE_HELP
from paramserver.launch.jobs import script_job
from paramserver.spec.job import JobSpec, Limits, ResumeSpec


def build_job(args, run_dir: Path | None = None) -> dict:
    """The job description; its key space comes from the first worker's model. With a
    `run_dir`, the servers save the final parameters into its checkpoints/ when the last worker
    has left (no checkpoint before that), from which launch writes model.pt."""
    from paramserver.cli.config_args import config_from_args
    return script_job(config_from_args(args), run_dir).to_dict()


# TrainConfig fields of the built-in task that a script's job never reads: left out of a
# script run's config.json and compare.json, where they would describe a model that did not run.
SCRIPT_UNUSED_CONFIG = (
    "model", "model_options", "model_size", "dataset", "data_dir", "dataset_options", "epochs",
    "threads", "eval_interval", "compress", "compress_options", "push_range", "schedule",
    "links", "restart_workers", "restart_servers", "checkpoint_dir", "checkpoint_every",
    "checkpoint_seconds")


# train's flags that launch does not take, and where a script says the same (the hint of the
# refusal, instead of the nearest flag's name).
_OWN_MODEL = "the script builds its model and loads its data itself"
ELSEWHERE = {
    "--compress": "the script picks its push codec: paramserver.DistributedOptimizer(..., "
                  "compression=\"bf16\")",
    "--pull-compress": "a launched script's pulls go dense",
    "--checkpoint-every": "launch keeps the final parameters (RUN/model.pt); the script saves "
                          "its own checkpoints (opt.state_dict())",
    "--model": _OWN_MODEL, "--dataset": _OWN_MODEL, "--data-dir": _OWN_MODEL,
    "--epochs": "the script runs its own epochs; give --steps or --max-seconds for a budget",
    "--device": "the script puts its model on its device (model.cuda())",
    "--amp": "the script runs its forward under torch.autocast itself",
    "--eval-interval": "the script evaluates itself: opt.report(test_accuracy=...)",
}
ELSEWHERE["--checkpoint-seconds"] = ELSEWHERE["--checkpoint-dir"] = ELSEWHERE["--checkpoint-every"]


def script_settings(cfg) -> dict:
    """cfg.as_dict() without SCRIPT_UNUSED_CONFIG."""
    return {k: v for k, v in cfg.as_dict().items() if k not in SCRIPT_UNUSED_CONFIG}


# A bare interpreter name runs as the one running paramserver, as torchrun does: the workers see
# the packages this command sees (an activated venv or not).
PYTHON_NAMES = ("python", "python3", f"python3.{sys.version_info.minor}")


def worker_command(command: list[str], local: bool = True) -> list[str]:
    """The worker command as it will run: `python` made this interpreter; on this machine
    (`local`), a program that cannot run refused now (ValueError with the fix), before any
    process starts or any run folder is made."""
    if not command:
        raise ValueError("give the worker command after --, e.g. paramserver launch -- "
                         "python train.py")
    prog, rest = command[0], list(command[1:])
    if prog in PYTHON_NAMES:
        # `python SCRIPT ...` (no interpreter option before it): a script that is not there
        # fails every worker at once; said now, before the servers start.
        if local and rest and not rest[0].startswith("-") and not Path(rest[0]).is_file():
            raise ValueError(f"no such file {rest[0]!r} (the script of the worker command "
                             f"after --, from {os.getcwd()})")
        return [sys.executable, *rest]
    if not local:
        return [prog, *rest]  # resolved on the host each worker lands on
    if os.sep in prog or (os.altsep and os.altsep in prog):
        path = Path(prog)
        if not path.is_file():
            raise ValueError(f"no such file {prog!r} (the worker command after --)")
        if not os.access(path, os.X_OK):
            raise ValueError(f"{prog!r} is not executable: run it through its interpreter, "
                             f"e.g. -- python {prog}")
    elif shutil.which(prog) is None:
        hint = (f"; a script runs through python: -- python {prog}"
                if prog.endswith(".py") else "")
        raise ValueError(f"no program {prog!r} on PATH (the worker command after --){hint}")
    return [prog, *rest]


def run_script(cfg, run_dir: Path, command: list[str], quiet: bool = False,
               timeout: float | None = None, watch=None, launcher: dict | None = None) -> dict:
    """One job of `command` as the workers under `cfg` (see script_job), as
    launch/jobs.run_training runs the built-in task: writes config.json (with the command),
    metrics.jsonl and summary.json into run_dir and returns the summary. A worker that exits
    with an error fails the run (LaunchError), as a dead built-in worker would.
    `watch(cluster)`, if given, is called at every poll while the job runs (as run_training's);
    `launcher` ({"name": "ray", ...}, as run_training's) places the processes on a Ray
    cluster instead of this machine."""
    from paramserver.launch.local import LaunchError, LocalCluster
    from paramserver.launch.core.verdict import rank_records, worker_failures
    from paramserver.runlog.metrics import read_records
    from paramserver.runlog.progress import JobProgress
    spec = script_job(cfg)
    job = spec.to_dict()
    write_config(run_dir, cfg, job, command)
    ray = bool(launcher) and launcher.get("name", "local") == "ray"
    if ray:
        from paramserver.launch.ray_launcher import RayCluster, Resources
        cluster = RayCluster(spec, run_dir, address=launcher.get("address"),
                             resources=Resources(**launcher.get("resources", {})),
                             job_timeout=timeout, worker_cmd=command)
    else:
        cluster = LocalCluster(spec, run_dir, job_timeout=timeout, worker_cmd=command,
                               restart_coordinator=cfg.restart_coordinator)
    with JobProgress(run_dir / "metrics.jsonl", spec.max_samples, f"{cfg.sync} x{cfg.workers}",
                     quiet) as bar:
        cluster.run(on_tick=bar.tick if watch is None else lambda: (bar.tick(), watch(cluster)))
    records = list(read_records(run_dir / "metrics.jsonl"))
    exits, tails = _worker_exits(cluster, "ray" if ray else "local")
    failures = worker_failures(exits, rank_records(records))
    if failures:
        raise LaunchError("\n".join(f"{what}:\n{tails.get(rank, '')}"
                                     for rank, what in failures))
    return write_summary(run_dir, records, job, command)


def write_config(run_dir: Path, cfg, job: dict, command: list[str]) -> None:
    """A script run's config.json: its settings, its job and the command its workers ran
    (what advise --profile and report read)."""
    import json
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(
        {"config": script_settings(cfg), "job": job, "command": command}, indent=2))


def write_summary(run_dir: Path, records: list, job: dict, command: list[str],
                  **extra) -> dict:
    """A script run's summary.json from its records (`extra`: interrupted=True)."""
    import json

    from paramserver.policies import SYNC_POLICIES
    from paramserver.runlog.metrics import summarize
    from paramserver.spec.run_job import RunJob
    mode = SYNC_POLICIES.get(RunJob.of(job).sync).apply_mode
    summary = summarize(records, {**job, "apply_mode": mode})
    # The job's task names no model or data set: the script is the model.
    summary.update(model=" ".join(command), dataset="the script's own", **extra)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _worker_exits(cluster, launcher: str) -> tuple[dict, dict]:
    """({rank: exit code}, {rank: its log's last lines}) of the workers as the job ended."""
    if launcher != "local":
        return cluster.worker_exits(), {}
    live = [c for c in cluster.children if c.role == "worker" and not c.replaced]
    return {c.index: c.proc.returncode for c in live}, {c.index: c.tail() for c in live}


def _final_model(run_dir: Path) -> str:
    """model.pt from the final checkpoint, under the script's own parameter names (the
    layout the coordinator wrote); what happened, in words."""
    from paramserver.runlog.model_file import FINAL_MODEL, ExportError, export
    try:
        path, what = export(run_dir, run_dir / FINAL_MODEL, "pt")
    except ExportError as exc:
        return f"no model written ({exc})"
    return f"model in {path} (from {what})"


def resume_point(run_dir: Path, job: JobSpec) -> ResumeSpec:
    """The newest usable checkpoint of launched run `run_dir` (its final parameters and the
    servers' optimizer state); ValueError naming what is missing."""
    from paramserver.runlog.checkpoint_set import usable_checkpoint
    root = run_dir / "checkpoints"
    tag, warnings = usable_checkpoint(root, job.servers, job.dtype)
    for warning in warnings:
        print(f"paramserver launch: {warning}", file=sys.stderr)
    if tag is None:
        raise ValueError(f"cannot resume {run_dir}: no usable checkpoint in {root} (a launched "
                         f"run saves one when its last worker leaves)")
    return ResumeSpec(str(root.resolve()), tag)


def _run(args) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        command = worker_command(command, local=args.launcher != "ray")
    except ValueError as exc:
        print(f"paramserver launch: {exc}", file=sys.stderr)
        return 2
    if flag.check_observe_args(args, "launch"):
        return 2
    run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-launch-{args.sync}")
    if args.launcher != "ray":
        from paramserver.launch import zygote
        zygote.warm()  # the coordinator's and the servers' imports, beside the checks below
    try:
        from paramserver.cli.config_args import config_from_args
        cfg = config_from_args(args)
        job = script_job(cfg, run_dir).to_dict()
        if args.resume:
            spec = JobSpec.from_dict(job)
            from paramserver.launch.jobs import check_budget_left, forget_unsaved
            resume = resume_point(Path(args.resume), spec)
            point = {"dir": resume.dir, "tag": resume.tag}
            if spec.max_samples is not None:
                check_budget_left(spec.max_samples, point,
                                  "--steps (it counts the resumed run's)")
            job = spec.with_resume(resume).to_dict()
            forget_unsaved(run_dir, point)
    except ValueError as exc:
        print(f"paramserver launch: {exc}", file=sys.stderr)
        return 2
    import json
    from paramserver.launch.console import ProgressLine
    from paramserver.launch.local import LaunchError, LocalCluster
    from paramserver.launch.core.verdict import rank_records, worker_failures
    from paramserver.runlog.metrics import read_records
    if args.launcher == "ray":
        for flag_name, used in (("--restart-coordinator", args.restart_coordinator),):
            if used:
                print(f"paramserver launch: {flag_name} is not supported with --launcher ray "
                      f"yet; use the local launcher for it", file=sys.stderr)
                return 2
        from paramserver.launch.ray_launcher import RayCluster, Resources
        cluster = RayCluster(job, run_dir, address=args.address, job_timeout=args.timeout,
                             resources=Resources(args.ray_worker_cpus, args.ray_worker_gpus,
                                                 args.ray_server_cpus),
                             worker_cmd=command, stream=sys.stdout)
        run_dir.mkdir(parents=True, exist_ok=True)  # export reads the job from job.json
        (run_dir / "job.json").write_text(json.dumps(job, indent=2))
    else:
        cluster = LocalCluster(job, run_dir, job_timeout=args.timeout, worker_cmd=command,
                               restart_coordinator=args.restart_coordinator, stream=sys.stdout)
    write_config(run_dir, cfg, job, command)
    metrics = run_dir / "metrics.jsonl"
    progress = None if args.quiet else ProgressLine(metrics, sys.stdout, cluster.console)
    cluster.progress = progress
    try:
        if isinstance(cluster, LocalCluster):  # a Ctrl-C keeps what was trained
            from paramserver.launch.jobs import save_interrupted
            cluster.run(on_tick=None if progress is None else progress.tick,
                        on_interrupt=lambda: save_interrupted(cluster, job, run_dir))
        else:
            cluster.run(on_tick=None if progress is None else progress.tick)
    except LaunchError as exc:
        print(f"paramserver launch: the job failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        write_summary(run_dir, list(read_records(metrics)) if metrics.exists() else [], job,
                      command, interrupted=True)
        print(f"paramserver launch: interrupted; {run_dir} keeps its logs, metrics, "
              f"summary.json of the steps done and model.pt when the servers answered",
              file=sys.stderr)
        return 130
    finally:
        if progress is not None:
            progress.close()
    records = list(read_records(metrics)) if metrics.exists() else []
    write_summary(run_dir, records, job, command)
    exits, tails = _worker_exits(cluster, args.launcher)
    failures = worker_failures(exits, rank_records(records))
    steps = sum(1 for r in records if r.get("kind") == "step")
    print(f"launch: {args.workers.text()} workers ran {' '.join(command)}; {steps} steps, "
          f"logs in {run_dir}; {_final_model(run_dir)}")
    for rank, failure in failures:
        tail = tails.get(rank)
        print(f"paramserver launch: {failure}" + (f"; its last output:\n{tail}" if tail else ""),
              file=sys.stderr)
    return 1 if failures else 0


# The one-line help of each command here (cli.main lists them without building parsers).
SUMMARY = {"launch": "run your own training script as the workers of a job (here, or "
                     "through Ray)"}


def add_policy_args(p) -> None:
    """The policy and update-rule flags of a job whose workers are the user's own code
    (launch's script, serve's KV clients)."""
    p.add_argument("--sync", default="bsp",
                   help=f"{catalog.listed(catalog.SYNC_POLICIES)} (default bsp); "
                        f"{catalog.AUTO_HELP}")
    p.add_argument("--sync-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="sync-policy option")
    p.add_argument("--optimizer", default="sgd",
                   help=f"server update rule: {catalog.listed(catalog.UPDATE_RULES)} "
                        f"(default sgd)")
    p.add_argument("--optimizer-opt", action="append", metavar="KEY=VALUE", type=flag.option,
                   help="update-rule option, e.g. momentum=0.9")
    p.add_argument("--lr", type=flag.positive_number, default=0.1, help="learning rate (default 0.1)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="batch size the policy starts from (default 32)")


def register(sub) -> None:
    p = sub.add_parser(
        "launch", help=SUMMARY["launch"],
        description="Start a coordinator and shard servers on 127.0.0.1 (or, with --launcher "
                    "ray, every process as a Ray actor, placed by Ray), then run COMMAND once "
                    "per worker with PARAMSERVER_JOIN (the job's address) and, as torchrun "
                    "sets them, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (and, "
                    "as torchrun does for several ranks, OMP_NUM_THREADS=1 unless it is set); "
                    "in the "
                    "script, paramserver.DistributedOptimizer(model) joins the job (see "
                    "README). Each worker's output goes to logs/worker-<rank>.log and to the "
                    "console as '[rank i] ...' lines, under a job progress line (steps, "
                    "samples/s, loss, a test metric if the script reports one, wait share). "
                    "Every rank must build the same model (a differing one is refused, naming "
                    "the parameter). The launch fails naming each rank that exits non-zero, "
                    "exits before joining, or finishes without calling opt.step(). At the end "
                    "the final parameters go to RUN/model.pt under the script's parameter "
                    "names (see `paramserver export`). "
                    "Under Ray, LOCAL_RANK is 0 and LOCAL_WORLD_SIZE 1 (Ray places each worker).")
    p.elsewhere = ELSEWHERE
    p.add_argument("--workers", type=flag.workers, default=flag.workers("2"),
                   metavar="N|MIN:MAX",
                   help="worker processes (default 2); MIN:MAX makes the job elastic: MIN "
                        "start, more join by hand (PARAMSERVER_JOIN=ADDR, the address in "
                        "RUN/coordinator.addr, and PARAMSERVER_KEYS=RUN/keys) up to MAX, a "
                        "worker sent SIGTERM finishes its "
                        "step and leaves; the script passes DistributedOptimizer(model, "
                        "data_len=len(dataset)) and draws through paramserver.BatchSampler")
    p.add_argument("--batch-rule", type=flag.batch_rule, default="fixed",
                   help=f"elastic jobs: {BATCH_RULE_HELP} (default fixed)")
    flag.add_shard_args(p)
    add_policy_args(p)
    p.add_argument("--steps", type=int, help="steps per worker before should_stop turns true "
                                             "(with --resume: counting the resumed run's); "
                                             "the workers share steps x workers steps' "
                                             "samples, MAX workers' worth in an elastic job")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="start from the newest checkpoint of launched run RUN_DIR: its "
                        "parameters and the servers' optimizer state (moments, step counts)")
    p.add_argument("--max-seconds", type=flag.positive_seconds,
                   help="stop after this much training time")
    p.add_argument("--straggler", default="none", type=flag.straggler,
                   help="slowness injected per worker rank, e.g. 1:3 (default none; grammar in "
                        "`paramserver train --help`): DistributedOptimizer stretches the "
                        "step's measured compute time")
    p.add_argument("--device-time", default="off", type=flag.device_time,
                   help="emulated device time per sample, e.g. 2ms (default off)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="float32 (default) or float64")
    p.add_argument("--heartbeat-timeout", type=flag.positive_seconds,
                   default=Limits.heartbeat_timeout,
                   help=f"seconds of silence before a worker is declared dead (default "
                        f"{Limits.heartbeat_timeout:g}, as train's)")
    p.add_argument("--stall-timeout", type=flag.positive_seconds,
                   help="seconds without a completed step after which the coordinator writes "
                        "RUN/stall-N.txt (see `paramserver doctor`) (default: 10 x the median "
                        "step time, at least 3 s or half the heartbeat timeout, whichever is "
                        "less; 10 x that floor until the first step ends)")
    p.add_argument("--max-message-bytes", type=flag.size, metavar="SIZE",
                   help="the largest frame a shard server accepts, e.g. 64MB (default: the "
                        "largest legitimate frame plus headroom, from the model size)")
    p.add_argument("--out", type=flag.out_folder,
                   help="run folder (default runs/<time>-launch-<sync>)")
    p.add_argument("--timeout", type=flag.positive_seconds, default=3600.0,
                   help="give up after this many s")
    p.add_argument("--restart-coordinator", type=flag.count, default=0,
                   help="restart a coordinator that dies, up to N times, at the same address; "
                        "it takes back the running servers and workers, which wait up to 30 s for it "
                        "(default 0)")
    from paramserver.cli.train_cmd import add_launcher_args
    add_launcher_args(p)
    flag.add_observe_args(p)
    p.add_argument("--quiet", action="store_true",
                   help="no job progress line (worker output is still shown)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the worker command, after --")
    p.set_defaults(func=_run)
