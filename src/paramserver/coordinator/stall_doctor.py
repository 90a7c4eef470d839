"""The coordinator node's side of the hang doctor: it feeds the stall detector (observe/core/stall.py)
with the steps it sees, announces legitimate pauses in events.jsonl, and on a stall probes every
live member over the sockets they already have (a worker's heartbeat connection, a server's
coordinator connection), waits a bounded time for their answers, and writes RUN/stall-<n>.txt.
Nothing is killed here: what follows a stall is the job's recovery settings' business."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from paramserver.coordinator.events import AppendEvent
from paramserver.observe.flight import ANSWER_LINES, MAX_LINE, MAX_STACK_CHARS, stack_dump
from paramserver.observe.core.stall import (
    MemberView, ProbeAnswer, ReportInput, StallDetector, StallSettings, build_report, headline,
    missing_workers,
)
from paramserver.wire import Message

log = logging.getLogger(__name__)

CHECK_EVERY = 0.25  # seconds between looks at the detector
MAX_REPORTS = 100  # stall reports one coordinator writes at most


@dataclass
class _Probe:
    n: int
    t: float
    deadline: float
    stall: object
    members: tuple
    expected: dict  # src -> role
    awaited: set  # of those, the ones heard lately: the report waits for their answers
    coordinator: ProbeAnswer
    answers: dict = field(default_factory=dict)


class StallDoctor:
    """Owned by the CoordinatorNode; `node` gives it the state (read only), the event log
    (`record`) and the socket (`send_to`)."""

    def __init__(self, node, settings: StallSettings, run_dir: Path | None, flight,
                 beat: float):
        self.node, self.run_dir, self.flight = node, run_dir, flight
        self.detector = StallDetector(settings, node.now())
        # Members answer from their heartbeat loop, within a beat; one silent for two beats
        # already (stopped, gone) is not waited for beyond the others, nor anyone beyond this.
        self.beat_s = beat
        self.probe_wait = max(2.0, 2 * beat + 1.0)
        self.links: dict = {}  # src -> the connection its heartbeats come on
        self.member_pauses: dict = {}  # src -> the reason of the pause it announced
        self.probe: _Probe | None = None
        self.next_check = 0.0
        self.reports = 0
        self.n = _last_report_number(run_dir)  # a restarted coordinator numbers on

    # ---- fed by the node ----------------------------------------------------------------------
    def beat(self, src: str, link) -> None:
        self.links[src] = link

    def clocked(self, src: str, now: float) -> None:
        self.detector.clocked(src, now)

    def released(self) -> None:
        self.detector.released(self.node.now())

    def reported(self, src: str, record) -> None:
        """A member's report: a pause it announces (CoordinatorSession.paused) or its end."""
        if not isinstance(record, dict) or record.get("kind") not in ("pause", "resume"):
            return
        if record["kind"] == "pause":
            self.member_pauses[src] = str(record.get("reason", "pause"))[:64]
        else:
            self.member_pauses.pop(src, None)

    def answer(self, msg: Message, now: float) -> None:
        """A stall_answer: kept if it answers the probe in flight, from a member it asked."""
        p = self.probe
        if p is None or msg.get("n") != p.n or msg.src not in p.expected:
            return
        flight = msg.get("flight") or ()
        waiting = msg.get("waiting")
        p.answers[msg.src] = ProbeAnswer(
            msg.src, p.expected[msg.src], str(msg.get("stack", ""))[:MAX_STACK_CHARS + 16],
            tuple(str(x)[:MAX_LINE] for x in list(flight)[:ANSWER_LINES]),
            waiting if isinstance(waiting, dict) else None, now - p.t)

    # ---- the node's loop turn -----------------------------------------------------------------
    def tick(self, now: float) -> None:
        if now < self.next_check:
            return
        self.next_check = now + CHECK_EVERY
        p = self.probe
        if p is not None:
            if p.awaited <= p.answers.keys() or now >= p.deadline:
                self.probe = None
                self._write(p, now)
            return
        state = self.node.state
        roster = state.members.roster
        running = (state.barrier.open and not state.finished and not state.stopping
                   and state.rejoins.pending is None and roster.workers)
        detector = self.detector
        if not running:
            detector.released(now)  # the clock runs only while steps are due
            return
        for kind, reason in detector.paused(self._pauses(state), now):
            self._event(now, kind, {"reason": reason})
        stall = detector.check(now, [s for s, m in roster.workers.items() if m.started])
        if stall is not None and self.reports < MAX_REPORTS:
            self._start_probe(stall, now)

    def _pauses(self, state) -> list[str]:
        """The legitimate pauses in force: a checkpoint being written, releases a policy holds
        on purpose until a time, an elastic job waiting below its minimum of workers, a pause
        a worker announced (its own evaluation)."""
        members = state.members.roster
        for src in [s for s in self.member_pauses if s not in members.workers
                    and s not in members.observers]:
            del self.member_pauses[src]  # it left mid-pause
        reasons = []
        for src, reason in sorted(self.member_pauses.items()):
            m = members.workers.get(src)
            reasons.append(f"{reason} (worker rank {m.rank})" if m is not None
                           else f"{reason} ({src})")
        if state.schedule.pending_tag is not None:
            reasons.append("checkpoint")
        if state.host.held():
            reasons.append("policy_wait")
        if state.elastic is not None and state.elastic.paused:  # below MIN: waits for joins
            reasons.append("waiting_for_workers")
        return reasons

    # ---- the probe ------------------------------------------------------------------------------
    def _start_probe(self, stall, now: float) -> None:
        self.n += 1
        self.reports += 1
        state = self.node.state
        members = self._views(state, now)
        expected, awaited = {}, set()
        for m in members:
            link = self.links.get(m.src)
            if link is None:
                continue  # never beat: nothing to ask it on (named as not answering)
            self.node.send_to(link, Message("stall_probe", {"n": self.n}, src="coord"))
            expected[m.src] = m.role
            if m.heard_s <= max(2 * self.beat_s, 1.0):
                awaited.add(m.src)
        began = time.monotonic()
        own = ProbeAnswer("coordinator", "coordinator", stack_dump(),
                          tuple(self.flight.lines(ANSWER_LINES)), None,
                          time.monotonic() - began)
        self.probe = _Probe(self.n, now, now + self.probe_wait, stall, members, expected,
                            awaited, own)
        log.warning("stall: %s; probing %d member(s) for their stacks", stall.kind,
                    len(expected))

    def _views(self, state, now: float) -> tuple[MemberView, ...]:
        roster, d = state.members.roster, self.detector
        views = [MemberView(s, "worker", m.rank, now - m.last_seen, m.steps,
                            m.waiting is not None, d.since_clock(s, now))
                 for s, m in roster.workers.items() if m.started]
        views += [MemberView(s, "server", m.rank, now - m.last_seen, addr=m.addr)
                  for s, m in roster.servers.items()]
        views += [MemberView(s, "observer", m.rank, now - m.last_seen)
                  for s, m in roster.observers.items()]
        return tuple(views)

    def _write(self, p: _Probe, now: float) -> None:
        state = self.node.state
        text = build_report(ReportInput(
            n=p.n, stall=p.stall, t=p.t, wall=time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                          time.gmtime()),
            policy=state.host.name, progress=state.progress, members=p.members,
            answers=p.answers, coordinator=p.coordinator, probe_wait_s=self.probe_wait,
            pauses=tuple(self.detector.pauses)))
        missing = missing_workers(p.stall, p.members)
        name = f"stall-{p.n}.txt"
        where = "(no run folder: not written)"
        if self.run_dir is not None:
            path = self.run_dir / name
            try:
                tmp = path.with_name(name + ".tmp")
                tmp.write_text(text)
                tmp.replace(path)  # a reader never sees half a report
                where = str(path)
            except OSError as exc:
                where = f"(not written: {exc})"
        self._event(now, "stall", {
            "n": p.n, "verdict": p.stall.kind, "file": name,
            "timeout_s": round(p.stall.timeout_s, 3), "missing": [m.rank for m in missing],
            "silent": sorted(m.src for m in p.members if m.src not in p.answers)})
        log.warning("%s; stall report %s", headline(text), where)


    def _event(self, now: float, kind: str, data: dict) -> None:
        """An events.jsonl line, as the node appends the core's (the metrics endpoint sees it)."""
        self.node.execute([AppendEvent(now, kind, data)])


def _last_report_number(run_dir: Path | None) -> int:
    if run_dir is None or not run_dir.is_dir():
        return 0
    numbers = [int(p.stem[6:]) for p in run_dir.glob("stall-*.txt")
               if p.stem[6:].isdigit()]
    return max(numbers, default=0)
