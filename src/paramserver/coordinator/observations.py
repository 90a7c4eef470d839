"""What members report and what observers are told: the coordinator's read-mostly part.

A worker's or evaluator's `report` becomes a metrics record; a worker's preflight link probes
go to preflight.json (`PreflightBook`); `status` and `observe` are answered from the state as
it stands, the latter with the latest metrics records (`RecentRecords`), so `top` and the
metrics endpoint see a job without reading its files; an `answered` error is logged. None of
these changes the job: the part owns only the two books, and reads the rest of `coord`.
"""

from __future__ import annotations

from paramserver.coordinator.events import (
    Answered, AppendEvent, AppendMetric, ObserveAsked, PreflightReported, Reply, Report,
    SavePreflight, StatusAsked, Warn,
)
from paramserver.coordinator.membership import UnknownMember
from paramserver.coordinator.recent import RecentRecords
from paramserver.observe.core.preflight import PreflightBook, parse_links

_OK: dict = {}  # the empty fields of an "ok" reply; never changed


class Observations:
    """The observations part of `coord` (a CoordinatorState)."""

    def __init__(self, coord):
        self.coord = coord
        self.recent = RecentRecords()  # the latest metrics records, for observers
        # Preflight link probes: each worker's figures, for RUN/preflight.json.
        self.preflight = PreflightBook(coord.job.workers)

    def handlers(self) -> dict:
        return {Report: self.on_report, StatusAsked: self.on_status,
                ObserveAsked: self.on_observe, PreflightReported: self.on_preflight,
                Answered: self.on_answered}

    def keep(self, out: list) -> None:
        """What goes to metrics.jsonl is kept for observers too."""
        for i in out:
            if type(i) is AppendMetric:
                self.recent.add(i.t, i.record)

    def on_report(self, e: Report, out: list) -> None:
        coord = self.coord
        role, member = coord.members.find(e.src)
        if member is not None:
            member.last_seen = e.now
        if role is None and e.src not in coord.members.roster.gone:
            raise UnknownMember(f"report from {e.src!r}, which is no registered worker or "
                                f"observer here")
        if role not in ("worker", "observer"):
            raise ValueError(f"report from {e.src!r}, which is no registered worker or "
                             f"observer")
        record = dict(e.record)
        age = record.pop("age_s", 0.0)
        coord.add_metric(e.now, record, out,
                         age=float(age) if isinstance(age, (int, float)) else 0.0)
        out.append(Reply(e.to, "ok", _OK))

    def on_status(self, e: StatusAsked, out: list) -> None:
        coord = self.coord
        coord.members.touch(e.src, e.now)
        roster, host, barrier = coord.members.roster, coord.host, coord.barrier
        t_start = barrier.t_start
        state = {"policy": host.name, "rounds_applied": host.rounds_applied,
                 "samples_done": host.samples_done, "stopping": host.stopping,
                 "started": barrier.open,
                 "waiting_for": None if barrier.open else coord.waiting_for(),
                 "workers_done": barrier.open and not roster.workers,
                 "elapsed_s": 0.0 if t_start is None else e.now - t_start,
                 "workers": {s: {"rank": m.rank, "steps": m.steps}
                             for s, m in roster.workers.items()},
                 "servers": {s: {"rank": m.rank, "addr": m.addr}
                             for s, m in roster.servers.items()},
                 "gone": dict(roster.gone)}
        out.append(Reply(e.to, "state", {"state": state}))

    def on_observe(self, e: ObserveAsked, out: list) -> None:
        """An observer is no member: it is answered and forgotten (no liveness, no rank)."""
        coord = self.coord
        seq, records, more = self.recent.since(e.since)
        roster, barrier = coord.members.roster, coord.barrier
        t_start = barrier.t_start
        workers = sorted(roster.workers.values(), key=lambda m: m.rank)[:256]
        elastic = coord.elastic
        members = {"policy": coord.host.name, "round_mode": coord.round_mode,
                   "started": barrier.open,
                   "finished": coord.finished or (
                       barrier.open and not roster.workers
                       and not (elastic is not None and elastic.paused)),
                   "elapsed_s": 0.0 if t_start is None else round(e.now - t_start, 3),
                   "workers": {str(m.rank): m.steps for m in workers},
                   "servers": len(roster.servers), "gone": len(roster.gone)}
        out.append(Reply(e.to, "observed", {"seq": seq, "records": records, "more": more,
                                            "members": members}))

    def on_preflight(self, e: PreflightReported, out: list) -> None:
        """A worker's link probes: preflight.json rewritten with them; once every worker of
        the job reported, one `preflight` event with all links (later, one per newcomer)."""
        member = self.coord.members.worker(e.src)
        member.last_seen = e.now
        links = parse_links(e.links)  # a malformed report is refused (ValueError)
        due = self.preflight.report(f"worker-{member.rank}", links)
        out.append(Reply(e.to, "ok", _OK))
        out.append(SavePreflight(self.preflight.document(e.now)))
        if due:
            out.append(AppendEvent(e.now, "preflight", {"links": self.preflight.entries(due)}))

    def on_answered(self, e: Answered, out: list) -> None:
        self.coord.members.touch(e.src, e.now)
        if e.error is not None:
            out.append(Warn(f"{e.src} reported an error: {e.error}", e.src))
