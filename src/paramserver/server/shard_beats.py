"""The shard's heartbeats: one every heartbeat_interval of event time, carrying the loss
counters for the job's metrics when they changed since the last one told them. Pure: the
node's clock and busy seconds come in with each TimePassed."""

from __future__ import annotations

from paramserver.server.events import Heartbeat


class ShardBeats:
    """When the next heartbeat is due and what the last one said, for `core` (a ShardCore)."""

    def __init__(self, core):
        self.core = core
        self.due = float("-inf")  # the first look at the clock beats
        self.busy_s = 0.0  # the node's busy seconds, as its last TimePassed said
        self._sent = {"late_pushes": 0, "duplicates": 0}  # the counters as the last beat told

    def tick(self, now: float, busy: float) -> Heartbeat | None:
        """The heartbeat due at `now`, if one is."""
        self.busy_s = busy
        if now < self.due:
            return None
        self.due = now + self.core.settings.heartbeat_interval
        return Heartbeat(self.changed_counters())

    def changed_counters(self) -> dict | None:
        """The counters for the job's metrics (summed in summary.json): pushes dropped as
        late, retries answered twice, retries refused as older than the dedup window; with
        tables, their rows, admissions and evictions (summed over tables); once the node has
        measured any, its busy seconds (to the millisecond: a shard with nothing to do stays
        quiet); None when the last heartbeat told them already."""
        core = self.core
        retries = core.retries.counters()
        counters = {"late_pushes": core.store.late_pushes, "duplicates": retries["duplicates"]}
        for name, n in (("refused_retries", retries["refused_retries"]),
                        ("refused_pushes", retries["refused_pushes"]),
                        ("refused_pulls", core.refused_pulls)):
            if n:
                counters[name] = n
        if core.tables:
            counters.update(core.tables.beat_counters())
        if self.busy_s:
            counters["busy_s"] = round(self.busy_s, 3)
        if counters == self._sent:
            return None
        self._sent = counters
        return counters
