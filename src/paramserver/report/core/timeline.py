"""A run's membership timeline: who joined, left, was lost or came back, and when, read from
its events.jsonl. Pure: events (the parsed lines) in, rows out; collect.py reads the file and
html.py draws the rows under each run.

Times are seconds of training (since the start barrier opened, as metrics.jsonl's `t`);
events before it are at their negative offset. A restarted coordinator's events count from
its own start, so they are placed after the last event of the one before.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a membership change reads as, by event kind; `None`: not shown.
def _joined(d: dict) -> str:
    return (f"worker {d.get('worker')} joined at round {d.get('round')} "
            f"({d.get('workers')} training)")


def _left(d: dict) -> str | None:
    if d.get("reason") == "done":
        return None  # the end of the job, not a change of it
    extra = f", {d['samples_returned']} samples given back" if d.get("samples_returned") else ""
    left = f" ({d['workers']} training)" if "workers" in d else ""
    return f"worker {d.get('worker')} left: {d.get('reason')}{extra}{left}"


DESCRIBE = {
    "worker_joined": _joined,
    "worker_left": _left,
    "waiting_for_workers": lambda d: (f"waiting: {d.get('workers')} worker(s) training, fewer "
                                      f"than the minimum {d.get('min_workers')}"),
    "workers_back": lambda d: (f"training again with {d.get('workers')} workers after "
                               f"{d.get('waited_s')} s"),
    "batch_rule": lambda d: (f"batch rule {d.get('rule')}: {d.get('workers')} workers, global "
                             f"batch {d.get('global_batch')}, lr x{d.get('lr_scale')}")
    if d.get("workers") else None,
    "server_lost": lambda d: f"server {d.get('rank')} lost ({d.get('addr')})",
    "server_rejoined": lambda d: f"server {d.get('rank')} restarted",
    "server_restored": lambda d: (f"server {d.get('rank')} restored from checkpoint "
                                  f"{d.get('checkpoint')}, {d.get('lost_updates')} updates "
                                  f"lost"),
    "taken_back": lambda d: (f"coordinator restarted: took back {d.get('servers')} servers and "
                             f"{d.get('workers')} workers at round {d.get('round')}"),
    "job_failed": lambda d: f"job failed: {d.get('reason')}",
    # --sync auto: the policy in force (policies/auto.py).
    "sync_switch": lambda d: (
        f"policy {d.get('to')} (was {d.get('from')}), predicted "
        f"{1 + float(d.get('gain', 0)):.2f}x as fast to target after a drain of "
        f"{float(d.get('drain_s', 0)):.2f} s: {d.get('reason')}"
        if d.get("from") else f"policy {d.get('to')} starts"),
    # Live resharding (the start's own server_joined events carry no epoch: not changes).
    "server_joined": lambda d: (f"server {d.get('addr')} joined as shard {d.get('rank')}: "
                                f"{d.get('servers')} servers, {d.get('moved_keys')} keys "
                                f"moved, steps held {d.get('pause_s')} s")
    if "epoch" in d else None,
    "server_drained": lambda d: (f"server {d.get('addr')} drained: {d.get('servers')} "
                                 f"servers, {d.get('moved_keys')} keys moved, steps held "
                                 f"{d.get('pause_s')} s"),
    "reshard_refused": lambda d: (f"server {d.get('kind')} of {d.get('addr')} given up: "
                                  f"{d.get('reason')}"),
}


@dataclass(frozen=True)
class TimelineRow:
    t: float  # seconds of training
    kind: str
    text: str


def membership_timeline(events: list[dict]) -> list[TimelineRow]:
    """The membership changes among `events` (events.jsonl's records, in file order)."""
    offset, t_open, last, rows = 0.0, None, 0.0, []
    for e in events:
        if not isinstance(e, dict) or not isinstance(e.get("t"), (int, float)):
            continue
        kind = e.get("event")
        if kind == "restart":  # a new coordinator's clock starts at 0 again
            offset = last
        t = offset + float(e["t"])
        last = max(last, t)
        if kind == "barrier_open" and t_open is None:
            t_open = t
        describe = DESCRIBE.get(kind)
        if describe is None:
            continue
        text = describe(e)
        if text is not None:
            rows.append(TimelineRow(t, kind, text))
    base = t_open or 0.0
    return [TimelineRow(round(r.t - base, 3), r.kind, r.text) for r in rows]
