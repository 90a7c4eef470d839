"""Where `paramserver top` gets its records: a run folder followed live or replayed, or the
coordinator's join address asked as an observer (the `observe` op: read-only, never a member).

Each source's `poll(now)` returns the metrics records that are new by `now` (seconds on the
caller's clock); `finished` says nothing more will come.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from paramserver.core.endpoints import endpoint
from paramserver.observe.core.stats import round_mode_of
from paramserver.runlog.folders import runs_hint

# What one poll of a live file reads at most: a view that fell behind catches up over a few.
READ_CHUNK = 4 << 20


class SourceError(ValueError):
    """A target that is neither a run folder nor a coordinator address, or one that answers
    with nonsense."""


@dataclass(frozen=True)
class Link:
    """One worker -> shard probe of RUN/preflight.json."""

    worker: str
    shard: int
    rtt_ms: float
    mbit_s: float


def read_preflight(run: Path) -> list[Link] | None:
    """RUN/preflight.json's links (schema version 1), None without the file; a malformed file
    or entry is skipped rather than failing the view."""
    try:
        doc = json.loads((run / "preflight.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        return None
    links = []
    for item in doc.get("links") or ():
        try:
            links.append(Link(str(item["worker"]), int(item["shard"]), float(item["rtt_ms"]),
                              float(item["mbit_s"])))
        except (KeyError, TypeError, ValueError):
            continue
    return links


def run_policy(run: Path) -> str | None:
    """The run's sync policy: job.json's, else the coordinator's start event's."""
    try:
        sync = json.loads((run / "job.json").read_text()).get("sync")
        if isinstance(sync, dict) and isinstance(sync.get("name"), str):
            return sync["name"]
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with open(run / "events.jsonl") as f:
            for line in itertools.islice(f, 16):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") in ("start", "restart") and rec.get("policy"):
                    return str(rec["policy"])
    except OSError:
        pass
    return None


class LineTail:
    """The complete JSON lines appended to a file since the last read (a line still being
    written waits for its newline; a line that is not JSON is skipped)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""
        self.at_end = False  # the last read reached the end of the file as it was then

    def read(self, limit: int = READ_CHUNK) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:  # rewritten: start over
                    self.offset, self.partial = 0, b""
                f.seek(self.offset)
                data = f.read(limit)
        except OSError:
            self.at_end = False
            return []
        self.at_end = len(data) < limit
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


class PolicyInForce:
    """Under --sync auto, the candidate in force over time: the sync_switch events of a run's
    events.jsonl, followed as the coordinator writes them, in seconds of training."""

    def __init__(self, run: Path):
        self.tail = LineTail(run / "events.jsonl")
        self.t_open: float | None = None
        self.switches: list[tuple[float, str]] = []  # (event time, candidate), in order

    def read(self) -> None:
        for rec in self.tail.read():
            t, kind = _time(rec), rec.get("event")
            if t is None:
                continue
            if kind == "barrier_open" and self.t_open is None:
                self.t_open = t
            elif kind == "sync_switch" and isinstance(rec.get("to"), str):
                self.switches.append((t, rec["to"]))

    def label(self, policy: str | None, at: float | None = None) -> str | None:
        """`policy`, with the candidate in force at `at` seconds of training (None: now)."""
        if not self.switches:
            return policy
        base = self.t_open or 0.0
        due = [c for t, c in self.switches if at is None or t - base <= at]
        return f"{policy}: {(due or [self.switches[0][1]])[-1]} in force"


class FolderSource:
    """A run folder followed as its coordinator writes it."""

    def __init__(self, run: Path):
        if not (run / "metrics.jsonl").exists() and not (run / "events.jsonl").exists():
            raise SourceError(f"{run} is no run folder (no metrics.jsonl or events.jsonl)"
                              + (runs_hint(run) or "; give a run folder or a coordinator "
                                                   "address tcp://HOST:PORT"))
        self.run = run
        self.tail = LineTail(run / "metrics.jsonl")
        self.policy = run_policy(run)
        self.round_mode = round_mode_of(self.policy)
        self.in_force = PolicyInForce(run)
        self.label = self.policy
        self.finished = False
        self.members: dict = {}
        self.describe = f"{run} (live)"

    def poll(self, now: float) -> list[dict]:
        # summary.json is written after the last metrics line: seen before the read, the read
        # gets everything.
        done = (self.run / "summary.json").exists()
        self.in_force.read()
        self.label = self.in_force.label(self.policy)
        records = self.tail.read()
        # (a read that stopped at its chunk's limit leaves the rest for the next poll)
        self.finished = done and not self.tail.partial and self.tail.at_end
        return records

    def preflight(self) -> list[Link] | None:
        return read_preflight(self.run)


class ReplaySource:
    """A finished run played back: the records due by `now` x `speed` seconds of the run's time
    (speed 0: all at once)."""

    def __init__(self, run: Path, speed: float = 1.0):
        if not (run / "metrics.jsonl").exists():
            raise SourceError(f"{run} has no metrics.jsonl to replay{runs_hint(run)}")
        if speed < 0:
            raise SourceError("--speed must be >= 0")
        self.run, self.speed = run, speed
        tail = LineTail(run / "metrics.jsonl")
        records = []
        while True:
            chunk = tail.read()
            if not chunk:
                break
            records.extend(chunk)
        self.records = sorted((r for r in records if _time(r) is not None), key=_time)
        self.next = 0
        self.policy = run_policy(run)
        self.round_mode = round_mode_of(self.policy)
        self.in_force = PolicyInForce(run)
        self.in_force.read()
        self.label = self.policy
        self.members: dict = {}
        self.describe = f"{run} (replay at {speed:g}x)" if speed else f"{run} (replay)"

    @property
    def finished(self) -> bool:
        return self.next >= len(self.records)

    def poll(self, now: float) -> list[dict]:
        if self.speed == 0:
            due = len(self.records)
        else:
            horizon = now * self.speed
            due = self.next
            while due < len(self.records) and _time(self.records[due]) <= horizon:
                due += 1
        out, self.next = self.records[self.next:due], due
        shown = _time(self.records[due - 1]) if due else 0.0
        self.label = self.in_force.label(self.policy, shown)
        return out

    def preflight(self) -> list[Link] | None:
        return read_preflight(self.run)


def _time(record: dict) -> float | None:
    t = record.get("t")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


class ObserverSource:
    """The coordinator at `address`, asked for its recent records with the `observe` op: it
    never registers, pushes or clocks, so the job does not know it is watched."""

    def __init__(self, address: str, timeout: float = 0.5, keys=None):
        import zmq

        from paramserver.transport import connect_dealer, new_context

        self._zmq = zmq
        self.address, self.timeout = address, timeout
        self.ctx = new_context()
        self.sock = connect_dealer(self.ctx, address, keys=keys, send_timeout=timeout,
                                   max_message=1 << 20)
        self.src = f"top-{os.getpid()}"
        self.seq = 0
        self.rid = itertools.count(1)
        self.members: dict = {}
        self.policy: str | None = None
        self.label: str | None = None
        self.round_mode = False
        self.finished = False
        self.silent_since: float | None = None
        self.describe = f"{address} (observer)"

    def poll(self, now: float) -> list[dict]:
        """Everything new since the last poll (several requests when the coordinator has more
        than one reply holds); [] when it does not answer within the timeout."""
        from paramserver.net import rpc
        from paramserver.wire import Message

        out: list[dict] = []
        for _ in range(64):  # bounded: at most 64 replies' worth per poll
            rid = next(self.rid)
            try:
                rpc.send(self.sock, Message("observe", {"since": self.seq}, rid=rid,
                                            src=self.src))
            except self._zmq.Again:
                break
            reply = self._reply(rid)
            if reply is None:
                if self.silent_since is None:
                    self.silent_since = now
                break
            self.silent_since = None
            if reply.op == "error":
                raise SourceError(f"the coordinator at {self.address} refused to be observed: "
                                  f"{reply['msg']}")
            self.seq = int(reply["seq"])
            records = [r for r in reply["records"] if isinstance(r, dict)]
            out.extend(records)
            self.members = reply.get("members") or {}
            if self.policy is None and self.members.get("policy"):
                self.policy = self.label = str(self.members["policy"])
                self.round_mode = round_mode_of(self.policy)
            self.finished = bool(self.members.get("finished"))
            if not reply.get("more"):
                break
        return out

    def _reply(self, rid: int):
        from paramserver.net import rpc

        while self.sock.poll(self.timeout * 1000):
            _, msg, _ = rpc.recv(self.sock, routed=False)
            if msg is not None and not isinstance(msg, Exception) and msg.rid == rid:
                return msg
        return None

    def preflight(self) -> list[Link] | None:
        return None

    def close(self) -> None:
        from paramserver.transport import terminate

        terminate(self.ctx, (self.sock,))


def open_source(target: str, replay: bool = False, speed: float = 1.0, keys=None):
    """The source for `paramserver top TARGET` (`keys`: an address's CURVE keys)."""
    if target.startswith(("tcp://", "ipc://")):
        if replay:
            raise SourceError("--replay needs a run folder, not an address")
        if target.startswith("tcp://"):
            target = endpoint(target)  # a malformed one named here, not by the socket
        return ObserverSource(target, keys=keys)
    run = Path(target)
    if not run.is_dir():
        raise SourceError(f"{target}: no such run folder (or give a coordinator address "
                          f"tcp://HOST:PORT)")
    return ReplaySource(run, speed) if replay else FolderSource(run)
