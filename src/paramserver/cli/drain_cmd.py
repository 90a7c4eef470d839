"""`paramserver drain TARGET --server R`: ask a running job (started with `--servers
MIN:MAX`) to let one shard server go. The coordinator moves the server's keys to the others at
the next point where every worker waits for its release, then stops it; nothing is lost."""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

SUMMARY = {"drain": "let a shard server of a running job go; its keys move to the others"}


class DrainError(RuntimeError):
    """The coordinator refused, or did not answer in time."""


def coordinator_address(target: str) -> tuple[str, str | None]:
    """(address, keys folder or None) of `target`: an address, or a run folder whose
    coordinator published its address in coordinator.addr (and whose keys are in keys/)."""
    if target.startswith("ipc://"):
        return target, None
    if target.startswith("tcp://"):
        from paramserver.core.endpoints import endpoint
        return endpoint(target), None  # a malformed one named here, not by the socket
    run = Path(target)
    try:
        address = (run / "coordinator.addr").read_text().strip()
    except OSError as exc:
        raise ValueError(f"{target} is neither an address (tcp://HOST:PORT) nor a run folder "
                         f"with a coordinator.addr ({exc.strerror})") from None
    keys = run / "keys"
    return address, str(keys) if keys.is_dir() else None


class Asker:
    """One DEALER to the coordinator, for requests answered by a single reply."""

    def __init__(self, address: str, keys_dir: str | None, timeout: float):
        from paramserver.transport import connect_dealer, new_context, security

        self.timeout = timeout
        keys = security.load(keys_dir, "observer") if keys_dir else None
        self.ctx = new_context()
        self.sock = connect_dealer(self.ctx, address, keys=keys, send_timeout=timeout,
                                   max_message=1 << 20)
        self.src = f"drain-{os.getpid()}"
        self.rids = itertools.count(1)
        self.address = address

    def ask(self, op: str, fields: dict):
        from paramserver.net import rpc
        from paramserver.wire import Message

        rid = next(self.rids)
        rpc.send(self.sock, Message(op, fields, rid=rid, src=self.src))
        deadline = time.monotonic() + self.timeout
        while (left := deadline - time.monotonic()) > 0 and self.sock.poll(left * 1000):
            _, msg, _ = rpc.recv(self.sock, routed=False)
            if msg is not None and not isinstance(msg, Exception) and msg.rid == rid:
                return msg
        raise DrainError(f"no answer from the coordinator at {self.address} within "
                         f"{self.timeout:g} s: is the job running, and are these its keys "
                         f"(--keys DIR)?")

    def close(self) -> None:
        from paramserver.transport import terminate

        terminate(self.ctx, (self.sock,))


def drain(target: str, rank: int, keys_dir: str | None = None, timeout: float = 10.0,
          wait: float = 0.0, out=sys.stdout) -> str:
    """Ask for the drain; with `wait` > 0, also wait (up to that many seconds) until the
    server is out of the job. Returns the drained server's address."""
    address, found_keys = coordinator_address(target)
    asker = Asker(address, keys_dir or found_keys or os.environ.get("PARAMSERVER_KEYS"),
                  timeout)
    try:
        state = asker.ask("status", {})
        servers = state["state"].get("servers", {}) if state.op == "state" else {}
        addr = next((s["addr"] for s in servers.values() if s.get("rank") == rank), None)
        reply = asker.ask("drain", {"rank": rank})
        if reply.op == "error":
            raise DrainError(f"the coordinator refused: {reply['msg']}")
        print(f"drain of server {rank} ({addr}) asked: its keys move at the next quiet point",
              file=out)
        if wait <= 0:
            return addr
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            state = asker.ask("status", {})
            servers = state["state"].get("servers", {}) if state.op == "state" else {}
            if addr not in {s.get("addr") for s in servers.values()}:
                print(f"server {addr} drained: {len(servers)} servers now", file=out)
                return addr
            time.sleep(0.2)
        raise DrainError(f"server {addr} still in the job after {wait:g} s (the job's "
                         f"events.jsonl says why: reshard_refused?)")
    finally:
        asker.close()


def _run(args) -> int:
    try:
        drain(args.target, args.server, args.keys, args.timeout, args.wait)
    except ValueError as exc:  # what was given names no job
        print(f"paramserver drain: {exc}", file=sys.stderr)
        return 2
    except (DrainError, OSError) as exc:
        print(f"paramserver drain: {exc}", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    from paramserver.cli import args as flag

    p = sub.add_parser(
        "drain", help=SUMMARY["drain"],
        description="Ask a running job started with --servers MIN:MAX to let shard server R "
                    "go. At the next point where every worker waits for its release, the "
                    "coordinator re-cuts the key ranges over the other servers (balancing "
                    "bytes and their measured load), the server hands its keys over, workers "
                    "go on with the new map and the server stops. Refused below MIN. Sending "
                    "SIGTERM to a server process of such a job does the same.")
    p.add_argument("target", metavar="TARGET",
                   help="the coordinator's address (tcp://HOST:PORT) or a local run folder")
    p.add_argument("--server", type=flag.count, required=True, metavar="R",
                   help="the rank of the server to drain (shard R of the current map)")
    p.add_argument("--keys", metavar="DIR",
                   help="the job's CURVE keys (default: RUN/keys of a run folder, or "
                        "$PARAMSERVER_KEYS); its observer key pair is used")
    p.add_argument("--timeout", type=flag.positive_seconds, default=10.0,
                   help="seconds to wait for each answer of the coordinator (default 10)")
    p.add_argument("--wait", type=flag.seconds, default=0.0,
                   help="also wait up to this long until the server is out of the job "
                        "(default 0: return once the drain is asked)")
    p.set_defaults(func=_run)
