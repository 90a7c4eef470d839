"""Coordinator process: the ROUTER socket, the run's event and metric logs and the clock around
the pure CoordinatorState (membership, key ranges, clocks, liveness, the sync policy's host)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import zmq

from paramserver.runlog.checkpoint_set import (
    load_coordinator_state, save_coordinator_state, usable_checkpoint,
)
from paramserver.coordinator.events import (
    Answered, AppendEvent, AppendMetric, Bye, Clocked, Finish, Heartbeat, Registered, Reply,
    Report, SaveCoordinatorState, SaveLayout, SendRelease, ShardRestored, ShardSaved, Started,
    StatusAsked, TimePassed, ToServers, Warn,
)
from paramserver.coordinator.events import CheckpointUnwritten, ClipPartial, ReplicaReport
from paramserver.coordinator.events import DrainAsked, Resharded
from paramserver.coordinator.events import CollectiveAsked, ObserveAsked
from paramserver.coordinator.events import PreflightReported, SavePreflight
from paramserver.coordinator.replica_history import ReplicaHistory
from paramserver.coordinator.worker_history import WorkerHistory
from paramserver.coordinator.state import CoordinatorState
from paramserver.core.bounded import json_value
from paramserver.core.exits import Exit, Refused
from paramserver.core.layout import ModelLayout
from paramserver.spec.job import OptimizerSpec
from paramserver.core.ratelimit import RefusalLog
from paramserver.net import rpc
from paramserver.observe.flight import FlightRecorder
from paramserver.coordinator.stall_doctor import StallDoctor
from paramserver.observe.core.stall import StallSettings
from paramserver.runlog.checkpoint import CheckpointError, CheckpointWriteError, latest
from paramserver.runlog.metrics import last_steps
from paramserver.spec.job import JobSpec
from paramserver.transport import advertised_host, bind_router, new_context, security, terminate
from paramserver.wire import Message, WireError
from paramserver.wire.protocol import CONTROL_MESSAGE_BYTES

log = logging.getLogger(__name__)

LAYOUT_FILE = "model_layout.json"  # the job's model layout, beside events.jsonl
PREFLIGHT_FILE = "preflight.json"  # the workers' link probes, beside events.jsonl
# The longest the loop sleeps without looking at the time (the core's wake-up may be later).
MAX_WAIT = 0.2
# What turning a parsed request into an event may raise: refused with an error reply.
REFUSED = (ValueError, KeyError, TypeError, IndexError, ArithmeticError)


# ---- op -> event: how each request becomes a stimulus of the core (dask's stream_handlers) ----

def _register(msg: Message, now: float, to, link) -> Registered:
    layout = msg.get("layout")  # a malformed one raises LayoutError (a ValueError): refused
    optimizer = msg.get("optimizer")  # likewise (JobSpecError)
    return Registered(msg.src, msg["role"], now, to, link, msg.get("addr"), msg.get("num_keys"),
                      msg.get("rejoin"), msg.get("want_rank"),
                      None if layout is None else ModelLayout.from_wire(layout),
                      bool(msg.get("backup", False)),
                      None if optimizer is None else OptimizerSpec.from_wire(optimizer))


def _clock(msg: Message, now: float, to, link) -> Clocked:
    f = msg.fields
    return Clocked(msg.src, f["step"], f["batch"], float(f["compute_time"]), now, to,
                   f.get("cpu_load"), f.get("free_mem"), f.get("record"), f.get("leave"))


EVENTS = {
    "clock": _clock,
    "start": lambda msg, now, to, link: Started(msg.src, now, to, msg.get("data_len")),
    "heartbeat": lambda msg, now, to, link: Heartbeat(msg.src, now, to, link,
                                                      msg.get("counters"), msg.get("shard")),
    "register": _register,
    "bye": lambda msg, now, to, link: Bye(msg.src, now, to, msg.get("reason", "done")),
    "report": lambda msg, now, to, link: Report(msg.src, msg["record"], now, to),
    "status": lambda msg, now, to, link: StatusAsked(msg.src, now, to),
    "observe": lambda msg, now, to, link: ObserveAsked(msg.src, msg["since"], now, to),
    "collective": lambda msg, now, to, link: CollectiveAsked(
        msg.src, msg["kind"], msg["name"], list(msg["values"]), now, to, msg.get("root", 0)),
    "saved": lambda msg, now, to, link: ShardSaved(msg.src, msg["tag"], now, to,
                                                   msg.get("failed")),
    "restored": lambda msg, now, to, link: ShardRestored(
        msg.src, msg["tag"], msg["lost_updates"], msg["version"], now, to),
    "ok": lambda msg, now, to, link: Answered(msg.src, now, to),
    "error": lambda msg, now, to, link: Answered(msg.src, now, to, msg["msg"]),
    # a primary about its backup (--replicas 2, coordinator/replicas.py)
    "backup_synced": lambda msg, now, to, link: ReplicaReport(msg.op, msg.src, now, to, link,
                                                              dict(msg.fields)),
    "backup_lost": lambda msg, now, to, link: ReplicaReport(msg.op, msg.src, now, to, link,
                                                            dict(msg.fields)),
    # a backup about its primary's dropped connection
    "primary_down": lambda msg, now, to, link: ReplicaReport(msg.op, msg.src, now, to, link,
                                                             dict(msg.fields)),
    "preflight": lambda msg, now, to, link: PreflightReported(msg.src, msg["links"], now, to),
    "drain": lambda msg, now, to, link: DrainAsked(msg.src, now, msg["rank"], to),
    # a shard holding a clipped round for its factor (coordinator/clip_rounds.py)
    "clip_partial": lambda msg, now, to, link: ClipPartial(msg.src, msg["step"],
                                                           float(msg["partial"]), msg["clip"],
                                                           now, to, link),
    "resharded": lambda msg, now, to, link: Resharded(msg.src, now, msg["epoch"],
                                                      msg.get("version", 0), to, link),
}


class CoordinatorNode:
    """Runs a CoordinatorState: turns messages into its events and its instructions into
    messages and log lines. A reply token is (transport peer, request id)."""

    def __init__(self, job: JobSpec, host: str = "127.0.0.1", port: int = 0,
                 address_file: str | None = None, events_path: str | None = None,
                 metrics_path: str | None = None, keys=None, advertise: str | None = None,
                 take_back: bool = False):
        self.keys = keys  # security.Keys: CURVE; INSECURE: plaintext off loopback
        self.secured = isinstance(keys, security.Keys)  # senders' key roles are checked
        self.host, self.port = host, port
        self.advertise = advertised_host(host, None, advertise)  # the address others dial
        self.address_file = address_file
        self.events = open(events_path, "a", buffering=1) if events_path else None
        # The run folder's model_layout.json sits beside events.jsonl.
        self.layout_path = (Path(events_path).with_name(LAYOUT_FILE) if events_path
                            else None)
        # A take-back: each worker's newest step record on disk, which its clock re-sent to
        # this coordinator would write again (runlog/metrics.last_steps).
        self.written_steps = last_steps(metrics_path) if take_back and metrics_path else {}
        self.metrics = open(metrics_path, "a", buffering=1) if metrics_path else None
        self.t0 = time.monotonic()
        root = job.checkpoint.dir if job.checkpoint is not None else None
        last = latest(Path(root)) if root is not None else None
        if take_back:
            if root is not None:  # the newest that passes its checks (a torn one is skipped)
                last, warnings = usable_checkpoint(root, job.servers, job.dtype,
                                                   num_keys=job.num_keys or None)
                for warning in warnings:
                    log.warning("%s", warning)
            saved = _saved_state(root, last)
            elapsed = _elapsed_so_far(metrics_path, saved)
            log.info("taking back the job from checkpoint %s, %.1f s into training", last,
                     elapsed)
            replicas, workers = _histories(events_path)
            self.state = CoordinatorState(job, None, last, take_back=saved, elapsed=elapsed,
                                          replica_history=replicas, worker_history=workers)
        else:
            resume = None
            if job.resume is not None:
                resume = load_coordinator_state(job.resume.dir, job.resume.tag)
                log.info("resuming from checkpoint %s: %d samples done", job.resume.tag,
                         resume["samples_done"])
            self.state = CoordinatorState(job, resume, last)
        self.take_back = take_back
        # The Prometheus endpoint (job.metrics_port): its figures, fed below as the logs are
        # written; the endpoint itself lives as long as run().
        self.exporter = None
        self.metrics_port, self.metrics_host = job.metrics_port, job.metrics_host
        if job.metrics_port is not None:
            from paramserver.observe.prom import JobMetrics
            self.exporter = JobMetrics(self.state.host.name)
        self.finished = False
        self.failure: str | None = None
        # Refused frames and requests, logged at a bounded rate (a flood costs a few lines).
        self.refusals = RefusalLog(log.warning, time.monotonic)
        # The hang doctor: the last protocol events, and a stall report when steps stop.
        self.flight = FlightRecorder()
        limits = job.limits
        self.doctor = StallDoctor(
            self, StallSettings(limits.stall_timeout, floor=min(3.0,
                                                                limits.heartbeat_timeout / 2)),
            Path(events_path).parent if events_path else None, self.flight,
            beat=limits.heartbeat_interval)
        self._execute = {
            SendRelease: self._send_release, ToServers: self._to_servers, Reply: self._reply,
            AppendEvent: self._append_event, AppendMetric: self._append_metric,
            SaveCoordinatorState: self._save, Warn: self._warn, Finish: self._finish,
            SaveLayout: self._save_layout, SavePreflight: self._save_preflight,
        }

    # ---- lifecycle ------------------------------------------------------------------------------
    def run(self) -> int:
        ctx = new_context()
        # Every message to the coordinator is a header (at most 64 KB): a larger frame drops
        # its sender's connection before it is read.
        self.sock, addr = bind_router(ctx, self.host, self.port, keys=self.keys,
                                      advertise=self.advertise,
                                      max_message=CONTROL_MESSAGE_BYTES)
        if self.address_file:
            with open(self.address_file + ".tmp", "w") as f:
                f.write(addr)
            os.replace(self.address_file + ".tmp", self.address_file)
        log.info("coordinator at %s, policy %s", addr, self.state.host.name)
        self.record("restart" if self.take_back else "start", address=addr,
                    policy=self.state.host.name)
        endpoint = None
        try:
            endpoint = self._serve_metrics()
            self._loop()
        finally:
            if endpoint is not None:  # the endpoint ends with the job
                endpoint.close()
            self._to_servers(self.state.shutdown(
                "job finished" if self.finished else "coordinator stopping"))
            terminate(ctx, (self.sock,))
            for f in (self.events, self.metrics):
                if f:
                    f.close()
        if self.failure is not None:
            print(f"paramserver coordinator: the job failed: {self.failure}", file=sys.stderr)
            return Exit.PEER_LOST  # every failure is a peer missing: a resumed job may finish
        return Exit.FINISHED

    def _serve_metrics(self):
        """The Prometheus endpoint of job.metrics_port, announced in the log and events.jsonl;
        None without one."""
        if self.exporter is None:
            return None
        from paramserver.observe.prom import MetricsEndpoint
        try:
            endpoint = MetricsEndpoint(self.exporter, self.metrics_host, self.metrics_port)
        except OSError as exc:  # a port taken: the job was asked to be seen, so it stops
            raise Refused(f"cannot serve metrics at {self.metrics_host}:{self.metrics_port}: "
                          f"{exc}") from None
        log.info("metrics at %s", endpoint.url)
        self.record("metrics_endpoint", url=endpoint.url, port=endpoint.port)
        return endpoint

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, kind: str, **data) -> None:
        if self.events:
            self.events.write(json.dumps({"t": round(self.now(), 6), "event": kind, **data}) + "\n")

    def _loop(self) -> None:
        state, sock = self.state, self.sock
        while not self.finished:
            wait = MAX_WAIT
            wakeup = state.next_wakeup()
            if wakeup is not None:
                wait = min(wait, max(0.0, wakeup - self.now()))
            if sock.poll(wait * 1000):
                self._drain()
            self.execute(state.handle(TimePassed(self.now())))
            self.doctor.tick(self.now())
            self.refusals.flush()
            if self.exporter is not None:
                roster = state.members.roster
                self.exporter.set_job(len(roster.workers), len(roster.servers), state.progress,
                                      state.samples_done)

    def _drain(self) -> None:
        handle, execute, events, sock = self.state.handle, self.execute, EVENTS, self.sock
        for _ in range(512):
            try:
                ident, msg, frames = rpc.recv_nowait(sock, routed=True)
            except zmq.Again:
                return
            if isinstance(msg, WireError):
                rpc.refuse(sock, ident, msg, "coord", frames, self.refusals)
                continue
            op = msg.op
            if op == "heartbeat":
                self.doctor.beat(msg.src, ident)
            else:
                self.flight.record("recv", op=op, src=msg.src, rid=msg.rid)
                if op == "stall_answer":
                    self.doctor.answer(msg, self.now())
                    continue
                if op == "report":
                    self.doctor.reported(msg.src, msg.get("record"))
            try:
                make = events.get(msg.op)
                if make is None:
                    raise ValueError(f"op {msg.op!r} is not served by the coordinator")
                if self.secured:
                    # The sender's key (`ident`, a transport.Peer) must be of the role it
                    # registers as, or registered in.
                    role = msg["role"] if msg.op == "register" else self.state.role_of(msg.src)
                    if role is not None:
                        security.check_role(ident, role, True)
                event = make(msg, time.monotonic() - self.t0, (ident, msg.rid), ident)
                if make is _clock:
                    self.doctor.clocked(msg.src, event.now)
            except REFUSED as exc:
                sender = f"{msg.src!r} ({rpc.peer_name(ident)})"
                self.refusals.refused(sender, f"refused {msg.op} from {sender}: {exc}")
                self._reply(Reply((ident, msg.rid), "error", {"msg": str(exc),
                                                             "code": "refused"}))
                continue
            execute(handle(event))

    # ---- instructions ---------------------------------------------------------------------------
    def execute(self, instructions: list) -> None:
        run = self._execute
        for i in instructions:
            run[type(i)](i)

    def _send_release(self, i: SendRelease) -> None:
        fields = {"step": i.step, "batch": i.batch, "min_version": i.min_version}
        if i.round_size:
            fields["round_size"] = i.round_size
        if i.round_id:
            fields["round_id"] = i.round_id
        if i.stop:
            fields["stop"] = True
        if i.scale != 1.0:
            fields["scale"] = float(i.scale)
        if i.samples is not None:
            fields["samples"] = i.samples
        if i.layout is not None:
            fields["epoch"], fields["layout"] = i.epoch, i.layout
        ident, rid = i.to
        rpc.send(self.sock, Message("release", fields, rid=rid, src="coord"), ident)
        self.flight.record("send", op="release", step=i.step, rid=rid)
        self.doctor.released()

    def _reply(self, i: Reply) -> None:
        ident, rid = i.to
        rpc.send(self.sock, Message(i.op, i.fields, rid=rid, src="coord"), ident)

    def _to_servers(self, i: ToServers) -> None:
        for ident in i.links:
            rpc.send(self.sock, Message(i.op, i.fields, src="coord"), ident)

    def send_to(self, ident, msg: Message) -> None:
        """A message on the connection `ident` (the hang doctor's probes)."""
        rpc.send_or_drop(self.sock, msg, ident)

    def _save_layout(self, i: SaveLayout) -> None:
        if self.layout_path is None:
            return
        tmp = self.layout_path.with_name(LAYOUT_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps(i.layout, indent=1))
            tmp.replace(self.layout_path)  # a reader never sees half a file
        except OSError as exc:  # the job goes on; only `export` needs the file
            log.warning("could not write %s: %s", self.layout_path, exc)

    def _save_preflight(self, i: SavePreflight) -> None:
        if self.layout_path is None:  # (no run folder)
            return
        path = self.layout_path.with_name(PREFLIGHT_FILE)
        tmp = path.with_name(PREFLIGHT_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps(i.document, indent=1))
            tmp.replace(path)  # a reader (top) never sees half a file
        except OSError as exc:  # the job goes on without it
            log.warning("could not write %s: %s", path, exc)

    def _append_event(self, i: AppendEvent) -> None:
        if self.events:
            self.events.write(json.dumps({"t": round(i.t, 6), "event": i.kind, **i.data}) + "\n")
        if self.exporter is not None:
            self.exporter.on_event(i.kind, i.data)

    def _append_metric(self, i: AppendMetric) -> None:
        if self.written_steps and i.record.get("kind") == "step" and \
                self.written_steps.pop(i.record.get("worker"), None) == i.record.get("step"):
            return  # (a worker's first record here: the dead coordinator wrote it already)
        if self.metrics:
            self.metrics.write(json.dumps({"t": round(i.t, 6), **i.record}) + "\n")
        if self.exporter is not None:
            self.exporter.on_metric(i.record)

    def _save(self, i: SaveCoordinatorState) -> None:
        try:
            save_coordinator_state(self.state.schedule.root, i.tag, i.state)
        except CheckpointWriteError as exc:
            self.execute(self.state.handle(CheckpointUnwritten(i.tag, str(exc), self.now())))

    def _warn(self, i: Warn) -> None:
        if i.source is not None:  # a refused request: a flood of them costs a few lines
            self.refusals.refused(repr(i.source), i.message)
        else:
            log.warning("%s", i.message)

    def _finish(self, i: Finish) -> None:
        if i.failure is not None:
            log.error("%s", i.failure)
            self.failure = i.failure
        self.finished = True


# The lines of events.jsonl a take-back reads (the histories' kinds, as the coordinator's
# event writer spells them); the rest is skipped unparsed.
_HISTORY_LINES = tuple(f'"event": "{kind}"'
                       for kind in sorted(ReplicaHistory.kinds | WorkerHistory.kinds))


def _histories(events_path: str | None) -> tuple[ReplicaHistory | None,
                                                  WorkerHistory | None]:
    """What the dead coordinator wrote in events.jsonl of its backups and of its workers, in
    one pass (None, None: no log to read; a line that does not parse is skipped)."""
    if not events_path:
        return None, None
    records = []
    try:
        with open(events_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if any(kind in line for kind in _HISTORY_LINES):
                    try:
                        records.append(json_value(line))
                    except ValueError:
                        continue
    except OSError as exc:
        log.warning("could not read %s for the backups' and workers' history: %s",
                    events_path, exc)
        return None, None
    return ReplicaHistory.of(records), WorkerHistory.of(records)


def _saved_state(root: str | None, tag: str | None) -> dict:
    """The coordinator's part of the latest checkpoint, {} without one (or unreadable: the
    live members hold what matters)."""
    if tag is None:
        return {}
    try:
        return load_coordinator_state(root, tag)
    except (OSError, ValueError, KeyError, CheckpointError) as exc:
        log.warning("taking back without checkpoint %s: %s", tag, exc)
        return {}


def _elapsed_so_far(metrics_path: str | None, saved: dict) -> float:
    """Seconds of training before this coordinator: the last metrics line's time plus the
    seconds since it was written (the checkpoint's figure without one)."""
    try:
        with open(metrics_path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = f.read().splitlines()
            mtime = os.fstat(f.fileno()).st_mtime
        for line in reversed(lines):
            try:
                t = json.loads(line)["t"]
            except (ValueError, KeyError, TypeError):
                continue
            return max(0.0, float(t) + max(0.0, time.time() - mtime))
    except (OSError, TypeError):
        pass
    return float(saved.get("elapsed_s", 0.0))


Coordinator = CoordinatorNode  # the name cli/roles.py and older callers use
