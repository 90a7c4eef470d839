"""The hang doctor's pure core: the stall detector the coordinator drives, and the stall report
built from the coordinator's view of its members and their answers to the stall probe.

A step completes when a worker is released into its next one. When none completes for the
stall timeout (given, or `factor` x the median step time observed, at least `floor`), the job
hangs; when steps complete but one worker has clocked none for that long, that worker is
missing (the job goes on without it, as asynchronous policies do). Legitimate pauses (a
checkpoint being written, a policy holding releases on purpose) stop the clock: the node
announces each as it begins and ends, and the full timeout runs again after the last ends.

No I/O, no clock: every time comes in as an argument (seconds on the coordinator's clock)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Iterable

HANG, MISSING = "hang", "missing"
STACK_LINES = 400  # of one member's stack dump, the most a report prints
FLIGHT_LINES = 64  # of one member's flight recorder lines, the most a report prints


@dataclass(frozen=True)
class StallSettings:
    """`timeout` in seconds, None: max(factor x median step time, floor) over the last
    `window` step times; before any step time is known, factor x floor (a first step may
    take long: a big model's, a slow device's, while every worker is inside it)."""

    timeout: float | None = None
    factor: float = 10.0
    floor: float = 3.0
    window: int = 64

    def __post_init__(self):
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"stall timeout must be > 0 seconds, got {self.timeout!r}")
        if not (self.factor > 0 and self.floor > 0 and self.window >= 1):
            raise ValueError("stall factor, floor and window must be positive")


@dataclass(frozen=True)
class Stall:
    """What the detector found: a hang (no step for `idle_s`) or missing workers (`late`:
    no clock from them for longer than the timeout)."""

    kind: str
    idle_s: float  # seconds since the last step completed (a hang) or the oldest late clock
    timeout_s: float
    median_step_s: float | None
    late: tuple[str, ...] = ()
    given: bool = False  # the timeout was given (not derived from the step time)


class StallDetector:
    """Watches steps complete; says when the job hangs or a worker goes missing, once per
    episode (a hang until the next step completes; a missing worker until it clocks again)."""

    def __init__(self, settings: StallSettings, now: float):
        self.settings = settings
        self._steps: deque = deque(maxlen=settings.window)  # seconds between a worker's clocks
        self._last_clock: dict[str, float] = {}
        self.last_progress = now
        self._pauses: dict[str, float] = {}  # reason -> since
        self._hang_told = False
        self._missing_told: set[str] = set()

    # ---- what happens -----------------------------------------------------------------------
    def clocked(self, worker: str, now: float) -> None:
        """`worker` finished a step (its clock came)."""
        last = self._last_clock.get(worker)
        if last is not None:
            self._steps.append(now - last)

        self._last_clock[worker] = now
        if self._missing_told:
            self._missing_told.discard(worker)

    def released(self, now: float) -> None:
        """A step completed: a worker was released into its next one."""
        self.last_progress = now
        self._hang_told = False

    def paused(self, reasons: Iterable[str], now: float) -> list[tuple[str, str]]:
        """The legitimate pauses in force now; returns the changes [("pause" or "resume",
        reason)] for the node to announce. The clock restarts when the last pause ends."""
        reasons = set(reasons)
        changes = [("pause", r) for r in sorted(reasons - self._pauses.keys())]
        changes += [("resume", r) for r in sorted(self._pauses.keys() - reasons)]
        for kind, r in changes:
            if kind == "pause":
                self._pauses[r] = now
            else:
                del self._pauses[r]
        if changes and not self._pauses:
            self.last_progress = max(self.last_progress, now)
            for w, t in self._last_clock.items():
                self._last_clock[w] = max(t, now)
        return changes

    # ---- judging ----------------------------------------------------------------------------
    @property
    def pauses(self) -> dict[str, float]:
        return dict(self._pauses)

    def median_step(self) -> float | None:
        return median(self._steps) if self._steps else None

    def timeout(self) -> float:
        s = self.settings
        if s.timeout is not None:
            return s.timeout
        m = self.median_step()
        return s.factor * s.floor if m is None else max(s.factor * m, s.floor)

    def check(self, now: float, workers: Iterable[str]) -> Stall | None:
        """A new stall, or None. `workers`: the started workers now in the job (one seen for
        the first time is awaited from now)."""
        if self._pauses:
            return None
        limit = self.timeout()
        last = self._last_clock
        workers = set(workers)
        for w in [w for w in last if w not in workers]:  # left, or declared dead
            del last[w]
        late = []
        for w in sorted(workers):
            t = last.setdefault(w, now)
            if now - t > limit and w not in self._missing_told:
                late.append(w)
        idle = now - self.last_progress
        if idle > limit:
            if self._hang_told:
                return None
            self._hang_told = True
            self._missing_told.update(late)
            return Stall(HANG, idle, limit, self.median_step(), tuple(sorted(late)),
                         self.settings.timeout is not None)
        if late:
            self._missing_told.update(late)
            oldest = max(now - last[w] for w in late)
            return Stall(MISSING, oldest, limit, self.median_step(), tuple(sorted(late)),
                         self.settings.timeout is not None)
        return None

    def since_clock(self, worker: str, now: float) -> float | None:
        t = self._last_clock.get(worker)
        return None if t is None else now - t


# ---- the report -------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemberView:
    """One member as the coordinator sees it. For a worker, `step` is the step it was last
    released into (`steps`), and `held` whether its clock of step-1 waits for a release."""

    src: str
    role: str  # worker, server or observer
    rank: int
    heard_s: float  # seconds since the coordinator last heard from it
    step: int | None = None
    held: bool = False
    clock_s: float | None = None  # seconds since its last clock (workers)
    addr: str = ""


@dataclass(frozen=True)
class ProbeAnswer:
    """A member's answer to the stall probe (or the coordinator's own), as received."""

    src: str
    role: str
    stack: str
    flight: tuple[str, ...] = ()
    waiting: dict | None = None
    took_s: float = 0.0


@dataclass(frozen=True)
class ReportInput:
    """Everything a stall report says, gathered by the node."""

    n: int
    stall: Stall
    t: float  # coordinator seconds since its start
    wall: str  # the wall-clock time the report was written, as text
    policy: str
    progress: int  # rounds applied (round mode) or worker steps
    members: tuple[MemberView, ...]
    answers: dict = field(default_factory=dict)  # src -> ProbeAnswer
    coordinator: ProbeAnswer | None = None
    probe_wait_s: float = 0.0
    pauses: tuple[str, ...] = ()


def describe_wait(w: dict | None) -> str:
    """A member's own `waiting` answer as one phrase: op, step, key range, peer."""
    if not w:
        return "nothing (not blocked in a request)"
    if w.get("op") == "serve":  # a server: it never blocks, it says what it holds back
        return f"nothing: serving ({w.get('note', '')})"
    parts = [str(w.get("op", "?"))]
    if w.get("step") is not None:
        parts.append(f"step {w['step']}")
    r = w.get("range")
    if isinstance(r, (list, tuple)) and len(r) == 2:
        parts.append(f"keys [{r[0]}, {r[1]})")
    if w.get("peer") is not None:
        parts.append(f"from {w['peer']}")
    if w.get("for_s") is not None:
        parts.append(f"for {_s(w['for_s'])}")
    if w.get("note"):
        parts.append(f"({w['note']})")
    return ", ".join(parts)


def missing_workers(stall: Stall, members: Iterable[MemberView]) -> list[MemberView]:
    """The workers a stall is about: for a hang, those that owe their clock of the round the
    others wait in (not held), or the late ones if none is held; else the late ones."""
    workers = [m for m in members if m.role == "worker"]
    late = set(stall.late)
    if stall.kind == HANG and any(m.held for m in workers):
        return [m for m in workers if not m.held]
    return [m for m in workers if m.src in late]


def build_report(r: ReportInput) -> str:
    """The text of stall-<n>.txt."""
    s, members = r.stall, sorted(r.members, key=lambda m: (_ROLE_ORDER.get(m.role, 9), m.rank))
    how = _s(s.timeout_s) + (", given" if s.given else ", derived") + (
        f"; median step {_s(s.median_step_s)}" if s.median_step_s is not None else "")
    missing = missing_workers(s, members)
    out = [f"paramserver stall report {r.n}",
           f"written {r.wall}, {r.t:.1f} s after the coordinator started; policy {r.policy}, "
           f"progress {r.progress}"]
    if s.kind == HANG:
        out.append(f"HANG: no step completed for {_s(s.idle_s)} (stall timeout {how})")
    else:
        out.append(f"MISSING WORKER (not a hang: the others step on): no clock for "
                   f"{_s(s.idle_s)} (stall timeout {how})")
    if r.pauses:
        out.append(f"pauses in force: {', '.join(r.pauses)}")
    out.append("")
    held = [m for m in members if m.role == "worker" and m.held]
    for m in missing:
        answered = r.answers.get(m.src)
        said = (f"says it waits for: {describe_wait(answered.waiting)}" if answered
                else "did not answer the probe")
        clock = "no clock yet" if m.clock_s is None else f"last clock {_s(m.clock_s)} ago"
        out.append(f"missing: worker rank {m.rank} ({m.src}): in step {m.step}, owes its clock "
                   f"of step {m.step}; {clock}, last heard {_s(m.heard_s)} ago; {said}")
    if s.kind == HANG and held:
        steps = sorted({m.step - 1 for m in held if m.step is not None})
        who = ", ".join(f"rank {m.rank}" for m in missing) or "no worker (the policy)"
        out.append(f"waiting: {len(held)} worker(s) ({', '.join(f'rank {m.rank}' for m in held)})"
                   f" clocked step {'/'.join(map(str, steps))} and wait for the release "
                   f"(op clock -> release, from the coordinator); the round waits on {who}")
    elif s.kind == HANG and not held:
        out.append("waiting: no worker's clock is held: the workers are inside their steps "
                   "(see what each says it waits for below)")
    silent = [m for m in members if m.src not in r.answers]
    if silent:
        out.append(f"not answering the probe (waited up to {_s(r.probe_wait_s)}): " + ", ".join(
            f"{m.role} rank {m.rank} ({m.src}, heard {_s(m.heard_s)} ago)" for m in silent))
    out.append("")
    out.append("== members (the coordinator's view; what each says it waits for) ==")
    for m in members:
        a = r.answers.get(m.src)
        line = f"{m.role} rank {m.rank} ({m.src}): heard {_s(m.heard_s)} ago"
        if m.role == "worker":
            line += (f"; step {m.step}, " + ("clock held, waits for its release"
                                              if m.held else "inside its step"))
            if m.clock_s is not None:
                line += f", last clock {_s(m.clock_s)} ago"
        if m.addr:
            line += f"; at {m.addr}"
        out.append(line)
        out.append("    waits for: " + (describe_wait(a.waiting) if a else
                                         "? (no answer to the probe)"))
    out.append("")
    out.append("== stacks and flight recorders ==")
    sections = ([("coordinator", r.coordinator)] if r.coordinator else []) + [
        (f"{m.role} rank {m.rank} ({m.src})", r.answers.get(m.src)) for m in members]
    for title, a in sections:
        out.append(f"--- {title} ---")
        if a is None:
            out.append("    (no answer: stopped, hung outside Python, or gone; its last "
                       "state is the coordinator's view above)")
            out.append("")
            continue
        out.append(f"answered in {_s(a.took_s)}")
        stack = a.stack.splitlines()
        out.append("stack (faulthandler, every thread):")
        out.extend("    " + line for line in stack[:STACK_LINES])
        if len(stack) > STACK_LINES:
            out.append(f"    ... ({len(stack) - STACK_LINES} more lines)")
        flight = list(a.flight)[-FLIGHT_LINES:]
        out.append(f"flight recorder (last {len(flight)} events, age before the probe):")
        out.extend("    " + line for line in flight)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


_ROLE_ORDER = {"worker": 0, "server": 1, "observer": 2}


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.0f} s"


def headline(text: str) -> str:
    """A report's verdict line (its third), for listings."""
    lines = text.splitlines()
    return lines[2] if len(lines) > 2 else "(empty report)"
