"""`paramserver coordinator|server|worker`: start one role of a job, locally or on another host."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.core.bounded import json_value
from paramserver.core.exits import Exit, PeerLost, Refused

# The transport (zmq) loads when a role starts, not for --help.

# How long a role given --join-file waits for its coordinator to publish the address there.
JOIN_FILE_WAIT = 60.0


def _setup_logging(role: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {role} %(levelname)s %(message)s")


def _keys(args, role: str):
    """security.Keys from --keys or $PARAMSERVER_KEYS; INSECURE with --insecure; else None."""
    from paramserver.transport import security
    directory = args.keys or os.environ.get(security.ENV)
    if getattr(args, "key_name", None) and not directory:
        raise security.SecurityError("--key-name needs --keys DIR (or $PARAMSERVER_KEYS)")
    if directory and getattr(args, "insecure", False):
        raise security.SecurityError("--keys (or $PARAMSERVER_KEYS) and --insecure exclude "
                                     "each other")
    if directory:
        return security.load(directory, role,
                             getattr(args, "key_name", None) or security.env_name(role))
    return security.INSECURE if getattr(args, "insecure", False) else None


def _join(args) -> str:
    """The coordinator's address: --join, or what the coordinator publishes in --join-file. A
    launcher that starts a role beside its coordinator passes the file, so the role's imports
    (torch: seconds on two busy cores) overlap the coordinator's start."""
    if args.join:
        return args.join
    deadline = time.monotonic() + JOIN_FILE_WAIT
    while True:
        try:  # the coordinator writes a temporary file and renames it: never half a line
            address = Path(args.join_file).read_text().strip()
        except FileNotFoundError:
            address = ""
        if address:
            return address
        if time.monotonic() > deadline:
            raise PeerLost(f"no coordinator address in {args.join_file} within "
                           f"{JOIN_FILE_WAIT:g} s")
        time.sleep(0.02)


def _clear_errors(func):
    """A role ends with a code of the exit table (core/exits.py) and, unless paramserver
    itself failed, one line saying why, not a traceback: refused input (bad keys, an unsafe
    bind, no address to advertise, a peer refusing this role) is REFUSED; a peer gone (a
    silent coordinator, a server that answers no more) is PEER_LOST, which an orchestrator
    may retry. The role's process then ends at once (see _end_process)."""
    @functools.wraps(func)
    def run(args) -> int:
        from paramserver.net.rpc import RemoteError
        from paramserver.transport import security
        from paramserver.transport.addresses import AddressError
        try:
            code = func(args)
        except (security.SecurityError, AddressError, Refused, RemoteError) as exc:
            print(f"paramserver {args.command}: {exc}", file=sys.stderr)
            code = Exit.REFUSED
        except (PeerLost, TimeoutError) as exc:  # (every wait on a peer is bounded)
            print(f"paramserver {args.command}: {exc}", file=sys.stderr)
            code = Exit.PEER_LOST
        except SystemExit as exc:
            code = exc.code
            if not isinstance(code, int):
                print(code, file=sys.stderr)
                code = Exit.FAILED if code is not None else Exit.FINISHED
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            code = Exit.INTERRUPTED
        except BaseException:
            traceback.print_exc()
            code = Exit.FAILED
        _end_process(int(code or 0))
    return run


def _end_process(code: int) -> None:
    """A role command owns its process, and when the role is done its sockets are closed and
    its files written: end the process now. The interpreter's own exit runs torch's C++ static
    destructors, measured here at 1.5 to 4.5 s on two busy cores, which would stretch every
    role's exit after its peer's death (benchmarks/exit_after_death.py) past its bound."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a reader that left
            pass
    os._exit(code)


@_clear_errors
def _run_coordinator(args) -> int:
    _setup_logging("coordinator")
    from paramserver.coordinator.node import Coordinator
    from paramserver.spec.job import JobSpec, JobSpecError
    try:
        with open(args.job) as f:
            job = JobSpec.from_dict(json_value(f.read()))  # without a version: version 1
    except (OSError, json.JSONDecodeError, JobSpecError) as exc:
        print(f"paramserver coordinator: cannot read job file {args.job}: {exc}", file=sys.stderr)
        return Exit.REFUSED
    from paramserver.launch.jobs import check_job_names
    try:
        check_job_names(job)
    except ValueError as exc:
        print(f"paramserver coordinator: job file {args.job}: {exc}", file=sys.stderr)
        return Exit.REFUSED
    from paramserver.transport import security
    keys = _keys(args, "coordinator")
    security.check_bind(args.bind, "tcp", keys)
    coordinator = Coordinator(job, args.bind, args.port, args.address_file, args.events,
                              args.metrics, keys=keys, advertise=args.advertise,
                              take_back=args.take_back)
    if "torch" in sys.modules:  # a predictor (NARX) loaded torch: one thread, no idle spinning
        sys.modules["torch"].set_num_threads(1)
    return coordinator.run()


@_clear_errors
def _run_server(args) -> int:
    _setup_logging("server")
    from paramserver.transport import security
    keys = _keys(args, "server")
    security.check_bind(args.bind, "tcp", keys)
    from paramserver.server.node import ServerNode
    return ServerNode(_join(args), args.bind, args.port, keys=keys,
                      advertise=args.advertise, backup=args.backup).run()


@_clear_errors
def _run_worker(args) -> int:
    _setup_logging("worker")
    keys = _keys(args, "worker")
    from paramserver.training.worker import run_worker
    return run_worker(_join(args), args.result_dir, keys=keys)


@_clear_errors
def _run_evaluator(args) -> int:
    _setup_logging("evaluator")
    keys = _keys(args, "observer")
    from paramserver.training.evaluator import run_evaluator
    return run_evaluator(_join(args), args.interval, keys=keys, save_model=args.save_model)


_KEYS_HELP = ("key folder from `paramserver keys generate` (default $PARAMSERVER_KEYS): "
              "CURVE-encrypt and authenticate every connection")
_KEY_NAME_HELP = ("which key pair of the folder to use: private/NAME.key_secret, a key of this "
                  "role such as worker-hostB (default $PARAMSERVER_KEY_NAME when it names a key "
                  "of this role, else the role's own)")
_INSECURE_HELP = ("allow binding a non-loopback address without keys (plaintext, anyone who "
                  "can reach the port may push and pull); prints a warning")


def _security_args(p, binds: bool) -> None:
    p.add_argument("--keys", metavar="DIR", help=_KEYS_HELP)
    p.add_argument("--key-name", metavar="NAME", help=_KEY_NAME_HELP)
    if binds:
        p.add_argument("--insecure", action="store_true", help=_INSECURE_HELP)


def _join_args(p, example: str) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--join", type=flag.endpoint, help=f"coordinator address{example}")
    where.add_argument("--join-file", metavar="FILE",
                       help="read the coordinator's address from FILE (its --address-file), "
                            f"waiting up to {JOIN_FILE_WAIT:.0f} s for the coordinator to write it")


def _bind_args(p, whom: str) -> None:
    p.add_argument("--bind", default="127.0.0.1",
                   help="interface to bind (default 127.0.0.1; 0.0.0.0: every interface)")
    p.add_argument("--port", type=flag.port, default=0, help="TCP port (default: a free one)")
    p.add_argument("--advertise", metavar="HOST",
                   help=f"the address other hosts dial to reach this {whom} when --bind is "
                        f"0.0.0.0 (default: this host's address on the route to {_ROUTE[whom]})")


_ROUTE = {"coordinator": "the default gateway", "server": "the coordinator"}


# The one-line help of each command here (cli.main lists them without building parsers).
SUMMARY = {"coordinator": "run the coordinator of a job",
           "server": "run one parameter-server shard",
           "worker": "run one worker",
           "evaluator": "run the test-set evaluator of a training job"}


def register(sub) -> None:
    p = sub.add_parser("coordinator", help=SUMMARY["coordinator"],
                       description="Run the coordinator: membership, key ranges, clocks and the "
                                   "sync policy. Servers and workers join its address.")
    p.add_argument("--job", required=True, help="job description (JSON, as written by train/demo)")
    _bind_args(p, "coordinator")
    p.add_argument("--address-file", help="write the bound address here once listening")
    p.add_argument("--events", help="append coordinator events (JSONL) to this file")
    p.add_argument("--metrics", help="append the job's metrics (JSONL) to this file")
    p.add_argument("--take-back", action="store_true",
                   help="replace a coordinator of this job that died: bind its address (--port), "
                        "take back the live servers and workers as they re-register, with the "
                        "job's latest checkpoint for what none of them holds")
    _security_args(p, binds=True)
    p.set_defaults(func=_run_coordinator)

    p = sub.add_parser("server", help=SUMMARY["server"],
                       description="Run one shard server; the coordinator assigns its key range.")
    _join_args(p, ", e.g. tcp://10.0.0.1:5555")
    _bind_args(p, "server")
    p.add_argument("--backup", action="store_true",
                   help="join a job with --replicas 2 as a shard's backup: the coordinator "
                        "pairs it with the first shard that has none, whose primary sends it "
                        "the shard and then every update; it takes over if the primary dies")
    _security_args(p, binds=True)
    p.set_defaults(func=_run_server)

    p = sub.add_parser("worker", help=SUMMARY["worker"],
                       description="Run one worker: joins the job and runs the task it names. "
                                   "An elastic job's (train --workers MIN:MAX) is joined at "
                                   "any time, up to MAX; SIGTERM then makes the worker finish "
                                   "its step and leave cleanly.")
    _join_args(p, ", e.g. tcp://10.0.0.1:5555")
    p.add_argument("--result-dir", help="write this worker's result JSON here")
    _security_args(p, binds=False)
    p.set_defaults(func=_run_worker)

    p = sub.add_parser("evaluator", help=SUMMARY["evaluator"],
                       description="Join as an observer: pull the parameters periodically, "
                                   "evaluate them on the test split and report to the metrics "
                                   "log; a last evaluation follows the end of training.")
    _join_args(p, "")
    p.add_argument("--interval", type=flag.positive_seconds, default=1.0,
                   help="seconds between evaluations (default 1)")
    p.add_argument("--save-model", metavar="FILE",
                   help="write the parameters of the last evaluation to FILE (a torch state "
                        "dict under the model's parameter names)")
    _security_args(p, binds=False)
    p.set_defaults(func=_run_evaluator)
