"""`paramserver serve --num-keys N`: a bare job (coordinator + shard servers, no built-in task)
for your own KVWorker clients; prints the address to join and runs until the job ends."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.cli.launch_cmd import add_policy_args
from paramserver.spec.job import JobSpec

DEFAULT_PORT = 5555  # the README's KV example joins tcp://127.0.0.1:5555


def build_job(args) -> JobSpec:
    """The job `serve` runs: a script's job (launch/jobs.py script_job, the one builder and
    its defaults) over --num-keys keys, with serve's longer start barrier (processes started
    by hand take their time)."""
    import dataclasses

    from paramserver.cli.config_args import config_from_args
    from paramserver.launch.jobs import script_job
    if args.num_keys < 1:
        raise ValueError(f"--num-keys must be at least 1, not {args.num_keys}")
    servers = getattr(args.servers, "min", args.servers)
    if args.workers < 1 or servers < 1:
        raise ValueError("--workers and --servers must be at least 1")
    job = script_job(config_from_args(args))
    return dataclasses.replace(job, num_keys=args.num_keys, limits=dataclasses.replace(
        job.limits, start_timeout=args.start_timeout))


def _run(args) -> int:
    try:
        job = build_job(args)
    except ValueError as exc:
        print(f"paramserver serve: {exc}", file=sys.stderr)
        return 2
    from paramserver.transport.addresses import PortInUse, port_taken
    if args.port and port_taken("127.0.0.1", args.port):
        print(f"paramserver serve: {PortInUse('127.0.0.1', args.port)}", file=sys.stderr)
        return 2
    from paramserver.launch.local import LaunchError, LocalCluster
    run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-serve")
    # Loopback and plaintext: a client needs the address only (for other hosts, start the
    # roles by hand with --keys, README "Run on a cluster").
    cluster = LocalCluster(job, run_dir, keys=None, coordinator_port=args.port,
                           job_timeout=args.timeout)
    try:
        address = cluster.start(spawn_workers=False)
        print(f"serve: {args.num_keys} keys on {job.servers} shard(s), {args.sync}, waiting "
              f"for {args.workers} worker(s); join at {address}\n"
              f"       e.g. KVWorker({address!r}); logs in {run_dir}", flush=True)
        cluster.wait()
        cluster.finish()
    except LaunchError as exc:
        print(f"paramserver serve: the job failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("serve: stopped", file=sys.stderr)
        return 130
    finally:
        cluster.stop()
    print(f"serve: the job ended; logs in {run_dir}")
    return 0


SUMMARY = {"serve": "a bare job for N keys (coordinator + shards, no task) that your own "
                    "KVWorker clients join"}


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help=SUMMARY["serve"],
        description="Start a coordinator (on 127.0.0.1:PORT) and shard servers for a flat "
                    "vector of N keys, with no built-in task, print the address to join, and "
                    "run until the job's step budget is spent (or --max-seconds, or Ctrl-C). "
                    "Clients are KVWorker(address) or DistributedOptimizer(join=address) "
                    "scripts; the start barrier waits for --workers of them (up to "
                    "--start-timeout, then goes on with those that came) and the coordinator "
                    "logs whom it waits for meanwhile. Plaintext on loopback only.")
    p.add_argument("--num-keys", type=int, required=True, metavar="N",
                   help="the length of the job's flat parameter vector")
    flag.add_shard_args(p)
    p.add_argument("--workers", type=int, default=1,
                   help="workers the start barrier waits for (default 1)")
    add_policy_args(p)
    p.add_argument("--steps", type=int, default=100,
                   help="steps per worker before the release says stop (default 100; 0: no "
                        "step budget)")
    p.add_argument("--max-seconds", type=flag.positive_seconds,
                   help="stop after this much training time")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="float32 (default) or float64")
    p.add_argument("--port", type=flag.port, default=DEFAULT_PORT,
                   help=f"the coordinator's port (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--start-timeout", type=flag.positive_seconds, default=600.0,
                   help="seconds the start barrier waits for all workers; with none by then "
                        "the job fails (default 600)")
    p.add_argument("--out", type=flag.out_folder,
                   help="run folder (default runs/<time>-serve)")
    p.add_argument("--timeout", type=flag.positive_seconds,
                   help="give up after this many s (default: none)")
    p.set_defaults(func=_run)
