"""`paramserver task --job FILE --dir DIR`: run this task's role of a job started by a scheduler.

A batch script starts the same command on every task of one step (`srun --ntasks N paramserver
task ...`), and each task picks its role from its number (launch/core/task_layout.py): task 0 the
coordinator, then the servers, the evaluator, the workers. They meet through DIR, a folder all
hosts see (the submit directory on a cluster's shared file system): the coordinator writes its
address there and the others read it, so no task needs another's host name. Then the task
becomes that role's own process (exec), so the scheduler's signals reach the role itself: a
worker of an elastic job sent SIGTERM finishes its step and leaves.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.core.bounded import json_value
from paramserver.core.exits import Exit

SUMMARY = {"task": "run this task's role of a job a scheduler started (Slurm's srun, torchrun)"}

# Where a task finds its number and the step's size: (index, count) variables, first match.
SCHEDULERS = (("SLURM_PROCID", "SLURM_NTASKS"), ("RANK", "WORLD_SIZE"))
# The attempt a rendezvous file belongs to: a requeued job (same job id) must not read the
# address of its previous attempt's coordinator.
ATTEMPT_VARS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT")


def task_number(args, env) -> tuple[int, int]:
    """(index, count) of this task: --index/--count, else the scheduler's variables."""
    if args.index is not None or args.count is not None:
        if args.index is None or args.count is None:
            raise ValueError("give --index and --count together")
        return args.index, args.count
    for index_var, count_var in SCHEDULERS:
        if index_var in env and count_var in env:
            try:
                return int(env[index_var]), int(env[count_var])
            except ValueError:
                raise ValueError(f"${index_var}={env[index_var]!r} and ${count_var}="
                                 f"{env[count_var]!r} are not task numbers") from None
    raise ValueError("no task number: run under srun (SLURM_PROCID, SLURM_NTASKS) or a "
                     "launcher that sets RANK and WORLD_SIZE, or give --index I --count N")


def rendezvous_file(directory: Path, env) -> Path:
    attempt = ".".join(env[v] for v in ATTEMPT_VARS if env.get(v))
    return directory / f"coordinator{'-' + attempt if attempt else ''}.addr"


def requeued(env) -> bool:
    """Whether the scheduler runs this job again (Slurm's requeue keeps the job id and counts
    the restarts)."""
    return env.get("SLURM_RESTART_COUNT", "0") not in ("", "0")


def resumed_job(job, args, env) -> str:
    """The job file the coordinator starts from: a requeued job (or --resume) whose job names a
    checkpoint folder holding a usable checkpoint goes on from the newest one, as `train
    --resume` does (the servers and workers learn it from the coordinator); else the job as
    given."""
    from paramserver.runlog.checkpoint_set import usable_checkpoint
    from paramserver.spec.job import ResumeSpec
    if not (args.resume or requeued(env)) or job.checkpoint is None:
        return args.job
    tag, warnings = usable_checkpoint(job.checkpoint.dir, job.servers, job.dtype,
                                      num_keys=job.num_keys or None)
    for warning in warnings:
        print(f"paramserver task: {warning}", file=sys.stderr)
    if tag is None:
        print(f"paramserver task: no usable checkpoint in {job.checkpoint.dir}: starting "
              f"over", file=sys.stderr)
        return args.job
    path = Path(args.dir) / f"job-resumed-{tag}.json"
    path.write_text(json.dumps(job.with_resume(ResumeSpec(job.checkpoint.dir, tag)).to_dict()))
    print(f"paramserver task: resuming from checkpoint {tag} in {job.checkpoint.dir}",
          file=sys.stderr, flush=True)
    return str(path)


def role_argv(role: str, args, eval_interval: float, env, job_file: str | None = None
              ) -> list[str]:
    """The `paramserver ROLE ...` command line of this task."""
    out = Path(args.dir)
    addr = str(rendezvous_file(out, env))
    secure = ["--keys", args.keys] if args.keys else []
    binds = secure + (["--insecure"] if args.insecure else [])
    if role == "coordinator":
        argv = ["coordinator", "--job", job_file or args.job, "--bind", args.bind,
                "--port", str(args.port),
                "--address-file", addr, "--metrics", str(out / "metrics.jsonl"),
                "--events", str(out / "events.jsonl")]
        advertise = args.advertise or _toward_launcher(args.bind, env)
        return argv + (["--advertise", advertise] if advertise else []) + binds
    join = ["--join-file", addr]
    if role in ("server", "backup"):
        argv = ["server", *join, "--bind", args.bind] + (["--backup"] if role == "backup" else [])
        return argv + (["--advertise", args.advertise] if args.advertise else []) + binds
    if role == "evaluator":
        return ["evaluator", *join, "--interval", str(eval_interval),
                "--save-model", str(out / "model.pt")] + secure
    return ["worker", *join, "--result-dir", str(out / "results")] + secure


def _toward_launcher(bind: str, env) -> str | None:
    """With a wildcard bind, the coordinator's address on the route to the host that started
    the step (SLURM_LAUNCH_NODE_IPADDR): an interface the other nodes reach, where a host
    without a default route has nothing else to tell."""
    from paramserver.transport.addresses import is_wildcard, route_source
    launcher = env.get("SLURM_LAUNCH_NODE_IPADDR")
    if not launcher or not is_wildcard(bind):
        return None
    try:
        return route_source(launcher)
    except OSError:
        return None


def _run(args) -> int:
    from paramserver.launch.core.task_layout import LayoutError, TaskLayout
    from paramserver.spec.job import JobSpec, JobSpecError
    env = os.environ
    try:
        index, count = task_number(args, env)
        job = JobSpec.from_dict(json_value(Path(args.job).read_text()))
        layout = TaskLayout.of(job, count)
        role, number = layout.role(index)
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    except (OSError, json.JSONDecodeError, JobSpecError, LayoutError, ValueError) as exc:
        print(f"paramserver task: {exc}", file=sys.stderr)
        return Exit.REFUSED
    try:
        job_file = resumed_job(job, args, env) if role == "coordinator" else None
    except OSError as exc:
        print(f"paramserver task: cannot write the resumed job file: {exc}", file=sys.stderr)
        return Exit.REFUSED
    argv = role_argv(role, args, job.eval_interval, env, job_file)
    print(f"paramserver task {index} of {count}: {role} {number} "
          f"(paramserver {' '.join(argv)})", file=sys.stderr, flush=True)
    # The role's own process from here: the scheduler's signals reach it, its exit code is
    # the task's.
    os.execv(sys.executable, [sys.executable, "-m", "paramserver", *argv])
    return Exit.FAILED  # (execv does not return)


def register(sub) -> None:
    p = sub.add_parser("task", help=SUMMARY["task"],
                       description="Run the role this task has in a job that a scheduler "
                                   "started as N copies of this command (srun --ntasks N "
                                   "paramserver task ...): task 0 is the coordinator, then "
                                   "the job's servers (and their backups with --replicas 2), "
                                   "the evaluator when the job evaluates, and every other "
                                   "task a worker. The tasks meet through --dir, a folder "
                                   "every host sees. The task's number comes from Slurm "
                                   "(SLURM_PROCID, SLURM_NTASKS) or RANK and WORLD_SIZE.")
    p.add_argument("--job", required=True,
                   help="the job file (paramserver train ... --write-job FILE)")
    p.add_argument("--dir", required=True,
                   help="a folder every task's host sees (a shared file system): the "
                        "coordinator's address, metrics.jsonl, events.jsonl and results/ go "
                        "there, and model.pt when the job evaluates (eval_interval > 0)")
    p.add_argument("--index", type=flag.count, help="this task's number (default: from the "
                                                    "scheduler's variables)")
    p.add_argument("--count", type=int, help="the step's task count (with --index)")
    p.add_argument("--bind", default="0.0.0.0",
                   help="interface the coordinator and servers bind (default 0.0.0.0: every "
                        "interface; each tells its peers the address on its route to them)")
    p.add_argument("--port", type=flag.port, default=5555,
                   help="the coordinator's TCP port (default 5555; servers take free ones)")
    p.add_argument("--advertise", metavar="HOST",
                   help="the address peers dial to reach this task's coordinator or server "
                        "(default: found from the route)")
    p.add_argument("--keys", metavar="DIR",
                   help="key folder from `paramserver keys generate` (default "
                        "$PARAMSERVER_KEYS); a non-loopback bind needs keys")
    p.add_argument("--resume", action="store_true",
                   help="go on from the newest usable checkpoint of the job's checkpoint folder "
                        "(a requeued Slurm job, SLURM_RESTART_COUNT > 0, does so by itself)")
    p.add_argument("--insecure", action="store_true",
                   help="bind a non-loopback address without keys (plaintext; see "
                        "`paramserver coordinator --help`)")
    p.set_defaults(func=_run)
