"""`paramserver coordinator|server|worker`: start one role of a job, locally or on another host."""

from __future__ import annotations

import json
import logging
import sys


def _setup_logging(role: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {role} %(levelname)s %(message)s")


def _warn_if_public(host: str) -> None:
    if host not in ("127.0.0.1", "localhost", "::1"):
        logging.warning("binding to %s: the transport is unauthenticated, anyone who can reach "
                        "this port can push and pull", host)


def _run_coordinator(args) -> int:
    _setup_logging("coordinator")
    from paramserver.runtime.coordinator import Coordinator
    try:
        with open(args.job) as f:
            job = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"paramserver coordinator: cannot read job file {args.job}: {exc}", file=sys.stderr)
        return 2
    _warn_if_public(args.bind)
    coordinator = Coordinator(job, args.bind, args.port, args.address_file, args.events,
                              args.metrics)
    if "torch" in sys.modules:  # a predictor (NARX) loaded torch: one thread, no idle spinning
        sys.modules["torch"].set_num_threads(1)
    return coordinator.run()


def _run_server(args) -> int:
    _setup_logging("server")
    from paramserver.runtime.server import ServerNode
    _warn_if_public(args.bind)
    return ServerNode(args.join, args.bind, args.port).run()


def _run_worker(args) -> int:
    _setup_logging("worker")
    from paramserver.runtime.worker import run_worker
    return run_worker(args.join, args.result_dir)


def _run_evaluator(args) -> int:
    _setup_logging("evaluator")
    from paramserver.runtime.evaluator import run_evaluator
    return run_evaluator(args.join, args.interval)


def register(sub) -> None:
    p = sub.add_parser("coordinator", help="run the coordinator of a job",
                       description="Run the coordinator: membership, key ranges, clocks and the "
                                   "sync policy. Servers and workers join its address.")
    p.add_argument("--job", required=True, help="job description (JSON, as written by train/demo)")
    p.add_argument("--bind", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    p.add_argument("--address-file", help="write the bound address here once listening")
    p.add_argument("--events", help="append coordinator events (JSONL) to this file")
    p.add_argument("--metrics", help="append the job's metrics (JSONL) to this file")
    p.set_defaults(func=_run_coordinator)

    p = sub.add_parser("server", help="run one parameter-server shard",
                       description="Run one shard server; the coordinator assigns its key range.")
    p.add_argument("--join", required=True, help="coordinator address, e.g. tcp://10.0.0.1:5555")
    p.add_argument("--bind", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    p.set_defaults(func=_run_server)

    p = sub.add_parser("worker", help="run one worker",
                       description="Run one worker: joins the job and runs the task it names.")
    p.add_argument("--join", required=True, help="coordinator address, e.g. tcp://10.0.0.1:5555")
    p.add_argument("--result-dir", help="write this worker's result JSON here")
    p.set_defaults(func=_run_worker)

    p = sub.add_parser("evaluator", help="run the test-set evaluator of a training job",
                       description="Join as an observer: pull the parameters periodically, "
                                   "evaluate them on the test split and report to the metrics "
                                   "log; a last evaluation follows the end of training.")
    p.add_argument("--join", required=True, help="coordinator address")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between evaluations (default 1)")
    p.set_defaults(func=_run_evaluator)
