"""A run's records as a Chrome trace (Trace Event Format), for Perfetto or chrome://tracing.

Pure: the records come in as dicts (cli/trace_cmd.py reads metrics.jsonl and events.jsonl),
the trace goes out as one JSON-able dict. Times are microseconds on one axis: metrics.jsonl's
`t` (seconds since the start barrier opened) and events.jsonl's `t` (since the coordinator
started) are put on the barrier's clock by the `barrier_open` event, then everything is shifted
so that the earliest event sits at 0 (`otherData.shift_us` says by how much).

A step record carries when its clock reached the coordinator (`t`) and how long each phase
took, not when each began. The phases are laid back to back, ending at `t`, in the order the
train task runs them: wait (for this step's release), pull, data (`data_s`, when recorded:
the first part of the compute time, which includes it), compute (`compute_s` less `data_s`:
the modelled time, which is what the worker spent, straggler sleeps included), push (until
every shard acknowledged). `t` is one hop after the push's end, so each
phase is drawn at most that hop late. A phase that would begin before the same worker's
previous step ended is cut to begin there (the records are rounded to the microsecond, and
round mode's early pull overlaps the previous step's wait), so the tracks never overlap.

Shards report apply time as totals per heartbeat (`shard` records: `apply_s`, `applies`,
`queue`, `backlog`; `server` records: cumulative `busy_s`), not per apply: they become counter events
("C") per shard. Membership changes, checkpoints, pauses, stalls and the like from events.jsonl
become instant events ("i"); `apply_round` is left out (every round is visible in the phases).

Size: `steps=(a, b)` keeps steps a <= step < b (and events within their time span); beyond
`max_events`, every k-th step is kept (the same steps for every worker) and the instants and
counters are thinned likewise, and a `trace sampled` instant at the start says what was dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

PHASES = ("wait", "pull", "data", "compute", "push")
# record field -> phase; compute falls back on the measured time when no modelled one is there
PHASE_FIELDS = {"wait": ("wait_s",), "pull": ("pull_s",), "data": ("data_s",),
                "compute": ("compute_s", "real_compute_s"), "push": ("push_s",)}
COORDINATOR_PID, WORKERS_PID, SHARDS_PID = 1, 2, 3
# events.jsonl kinds left out: one per round, and the rounds are in the phases already
SKIPPED_EVENTS = frozenset({"apply_round"})
# events.jsonl kinds drawn on a worker's own track when they name its rank
WORKER_EVENTS = frozenset({"worker_registered", "worker_left", "worker_taken_back"})
SHARD_COUNTERS = ("apply_s", "applies", "queue", "backlog")
DEFAULT_MAX_EVENTS = 200_000
US = 1e6


class TraceError(ValueError):
    """Records a trace cannot be made of (none at all, a step window that holds no step)."""


@dataclass(frozen=True)
class TraceOptions:
    """`steps`: (first, end) with end exclusive, either None for open; `max_events`: the
    most events the trace may hold (metadata included)."""

    steps: tuple[int | None, int | None] | None = None
    max_events: int = DEFAULT_MAX_EVENTS

    def __post_init__(self):
        if not isinstance(self.max_events, int) or self.max_events < 100:
            raise TraceError(f"max_events must be a whole number >= 100, got "
                             f"{self.max_events!r}")

    def keeps(self, step: int) -> bool:
        if self.steps is None:
            return True
        lo, hi = self.steps
        return (lo is None or step >= lo) and (hi is None or step < hi)


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """'A:B' (A <= step < B), 'A:' or ':B' into a window; a clear ValueError otherwise."""
    lo, sep, hi = text.partition(":")
    if not sep:
        raise ValueError(f"steps {text!r} is not A:B (e.g. 100:200, 100: or :50)")
    try:
        window = (int(lo) if lo.strip() else None, int(hi) if hi.strip() else None)
    except ValueError:
        raise ValueError(f"steps {text!r} is not A:B with whole numbers") from None
    if any(v is not None and v < 0 for v in window):
        raise ValueError(f"steps {text!r}: steps are >= 0")
    if window[0] is not None and window[1] is not None and window[1] <= window[0]:
        raise ValueError(f"steps {text!r} is empty: B must be above A")
    return window


def _num(record: dict, key: str) -> float | None:
    v = record.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _phase_seconds(record: dict) -> list[tuple[str, float]]:
    found = {}
    for phase in PHASES:
        for key in PHASE_FIELDS[phase]:
            v = _num(record, key)
            if v is not None:
                found[phase] = max(0.0, v)
                break
    if "data" in found:  # drawing the batch is part of the record's compute time
        found["data"] = min(found["data"], found.get("compute", 0.0))
        if "compute" in found:
            found["compute"] -= found["data"]
    return [(phase, found[phase]) for phase in PHASES if phase in found]


def _step_events(record: dict, last_end: float | None,
                 phases: list[tuple[str, float]]) -> list[dict]:
    """The `phases` of one step record as dicts (phase, start, dur, args), start times on the
    barrier's clock in seconds (converted later)."""
    end = _num(record, "t")
    begin = end - sum(d for _, d in phases)
    out = []
    args = {"step": record.get("step")}
    for key in ("batch", "staleness", "loss"):
        if _num(record, key) is not None:
            args[key] = record[key]
    for phase, dur in phases:
        start, stop = begin, begin + dur
        begin = stop
        if last_end is not None and start < last_end:
            start = min(last_end, stop)
        if stop - start <= 0:
            continue
        extra = {}
        if phase in ("pull", "push") and _num(record, f"{phase}_bytes") is not None:
            extra["bytes"] = record[f"{phase}_bytes"]
        out.append({"phase": phase, "start": start, "dur": stop - start,
                    "args": {**args, **extra}})
    return out


def _barrier_t(events: list[dict]) -> float:
    """events.jsonl's time of the (last) barrier_open: where metrics.jsonl's clock starts."""
    t = 0.0
    for e in events:
        if e.get("event") == "barrier_open" and _num(e, "t") is not None:
            t = float(e["t"])
    return t


def _rank(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def _stride(items: list, every: int) -> list:
    return items if every <= 1 else items[::every]


def build_trace(metrics: Iterable[dict], events: Iterable[dict],
                options: TraceOptions = TraceOptions()) -> dict:
    """The Chrome trace of a run's metrics.jsonl and events.jsonl records."""
    metrics, events = list(metrics), list(events)
    barrier = _barrier_t(events)
    steps = sorted((r for r in metrics if r.get("kind") == "step"
                    and _rank(r.get("worker")) is not None and _rank(r.get("step")) is not None
                    and _num(r, "t") is not None),
                   key=lambda r: (r["worker"], r["step"], r["t"]))
    all_steps = len(steps)
    steps = [r for r in steps if options.keeps(r["step"])]
    if options.steps is not None and all_steps and not steps:
        raise TraceError(f"no step record in steps {options.steps[0]}:{options.steps[1]} "
                         f"(the run has {all_steps} step records)")

    # Each record's phases, counted before any event is built (a long run has millions).
    seconds = [_phase_seconds(r) for r in steps]
    span = None
    if options.steps is not None and steps:
        span = (min(r["t"] - sum(d for _, d in p) for r, p in zip(steps, seconds)),
                max(r["t"] for r in steps))

    def within(t: float) -> bool:
        return span is None or span[0] <= t <= span[1]

    # Instants: events.jsonl, on the barrier's clock (metrics.jsonl's `left` and `restart`
    # records say again what its worker_left and server_restored say).
    instants = []
    for e in events:
        kind, t = e.get("event"), _num(e, "t")
        if not isinstance(kind, str) or t is None or kind in SKIPPED_EVENTS:
            continue
        t -= barrier
        if within(t):
            instants.append({"kind": kind, "t": t, "args": {k: v for k, v in e.items()
                                                             if k not in ("t", "event")}})
    instants.sort(key=lambda i: i["t"])

    counters = _shard_counters(metrics, within)

    # Thinning: metadata and the note first, then instants and counters (at most half of
    # what is left), then the phases, every k-th step.
    workers = sorted({r["worker"] for r in steps})
    shards = sorted({c["shard"] for c in counters})
    meta_count = 8 + 2 * (len(workers) + len(shards))
    room = max(0, options.max_events - meta_count)
    side = len(instants) + len(counters)
    side_every = 1 if side <= room // 2 else math.ceil(side / max(1, room // 2))
    instants, counters = _stride(instants, side_every), _stride(counters, side_every)
    room -= len(instants) + len(counters)
    per_step: dict[int, int] = {}
    for r, p in zip(steps, seconds):
        per_step[r["step"]] = per_step.get(r["step"], 0) + len(p)
    phase_count = sum(per_step.values())
    step_ids = sorted(per_step)
    every, kept = 1, None
    if phase_count > room:
        every = math.ceil(phase_count / max(1, room))
        while every > 1 and sum(per_step[i] for i in step_ids[::every]) > room:
            every += 1
        kept = set(step_ids[::every])

    # Worker phases, each worker's steps in order; a phase is cut at the end of the worker's
    # previous step record, kept or not.
    phases: dict[int, list[dict]] = {w: [] for w in workers}
    last_end: dict[int, float] = {}
    for r, p in zip(steps, seconds):
        w = r["worker"]
        if kept is None or r["step"] in kept:
            phases[w].extend(_step_events(r, last_end.get(w), p))
        last_end[w] = r["t"]
    kept_phases = sum(len(v) for v in phases.values())

    # On the barrier's clock so far; shifted so that nothing starts before 0.
    times = [e["start"] for evs in phases.values() for e in evs] + \
        [i["t"] for i in instants] + [c["t"] for c in counters]
    shift = -min(0.0, min(times, default=0.0))

    def us(t: float) -> float:
        return round((t + shift) * US, 3)

    out: list[dict] = _metadata(workers, shards)
    for w in workers:
        for e in phases[w]:
            out.append({"name": e["phase"], "cat": "phase", "ph": "X", "ts": us(e["start"]),
                        "dur": round(e["dur"] * US, 3), "pid": WORKERS_PID, "tid": w + 1,
                        "args": e["args"]})
    for i in instants:
        rank = _rank(i["args"].get("rank", i["args"].get("worker")))
        on_worker = rank is not None and i["kind"] in WORKER_EVENTS and rank in phases
        out.append({"name": i["kind"], "cat": "event", "ph": "i", "ts": us(i["t"]),
                    "pid": WORKERS_PID if on_worker else COORDINATOR_PID,
                    "tid": rank + 1 if on_worker else 1, "s": "t" if on_worker else "g",
                    "args": i["args"]})
    for c in counters:
        out.append({"name": f"shard {c['shard']} {c['name']}", "cat": "shard", "ph": "C",
                    "ts": us(c["t"]), "pid": SHARDS_PID, "tid": c["shard"] + 1,
                    "args": {c["name"]: c["value"]}})
    dropped_phases = phase_count - kept_phases
    dropped_side = side - len(instants) - len(counters)
    note = {"max_events": options.max_events, "step_records": len(steps),
            "kept_every_step": every, "dropped_phase_events": dropped_phases,
            "kept_every_event": side_every, "dropped_events": dropped_side,
            "steps": None if options.steps is None else list(options.steps)}
    if dropped_phases or dropped_side:
        out.append({"name": "trace sampled", "cat": "note", "ph": "i", "ts": 0,
                    "pid": COORDINATOR_PID, "tid": 1, "s": "g", "args": note})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"source": "paramserver", "clock": "seconds since the start barrier "
                          "opened, shifted by shift_us", "shift_us": round(shift * US, 3),
                          "workers": workers, "shards": shards, **note}}


def _shard_counters(metrics: list[dict], within) -> list[dict]:
    """Per shard counter samples: a `shard` record's per-beat apply_s/applies/queue, and the
    busy seconds between two `server` records (their busy_s is cumulative)."""
    out = []
    busy: dict[int, float] = {}
    for r in sorted((r for r in metrics if r.get("kind") in ("shard", "server")
                     and _num(r, "t") is not None), key=lambda r: r["t"]):
        shard = _rank(r.get("shard", r.get("server")))
        if shard is None or not within(r["t"]):
            continue
        if r["kind"] == "shard":
            for key in SHARD_COUNTERS:
                v = _num(r, key)
                if v is not None:
                    out.append({"shard": shard, "name": key, "t": r["t"], "value": v})
        v = _num(r, "busy_s")
        if v is not None:
            out.append({"shard": shard, "name": "busy_s", "t": r["t"],
                        "value": round(max(0.0, v - busy.get(shard, 0.0)), 6)})
            busy[shard] = v
    return out


def _metadata(workers: list[int], shards: list[int]) -> list[dict]:
    def meta(name: str, pid: int, args: dict, tid: int = 0) -> dict:
        return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}

    out = [meta("process_name", COORDINATOR_PID, {"name": "coordinator"}),
           meta("process_sort_index", COORDINATOR_PID, {"sort_index": 0}),
           meta("thread_name", COORDINATOR_PID, {"name": "events"}, 1),
           meta("process_name", WORKERS_PID, {"name": "workers"}),
           meta("process_sort_index", WORKERS_PID, {"sort_index": 1}),
           meta("process_name", SHARDS_PID, {"name": "shards"}),
           meta("process_sort_index", SHARDS_PID, {"sort_index": 2})]
    for w in workers:
        out.append(meta("thread_name", WORKERS_PID, {"name": f"worker {w}"}, w + 1))
        out.append(meta("thread_sort_index", WORKERS_PID, {"sort_index": w}, w + 1))
    for s in shards:
        out.append(meta("thread_name", SHARDS_PID, {"name": f"shard {s}"}, s + 1))
        out.append(meta("thread_sort_index", SHARDS_PID, {"sort_index": s}, s + 1))
    return out
