"""FlightRecorder: the last protocol events of one process, kept in memory, always on; and the
answer a process gives the coordinator's stall probe (what it waits for, its flight recorder's
lines, a faulthandler dump of every thread).

Recording costs a clock read, a dict of the keyword arguments and a bounded deque's append:
nothing is formatted until a probe asks for the lines. A probe is answered from a thread the
process's main work does not block (a worker's heartbeat thread, a server's loop), so a
process stuck in its step still says where it is stuck; a stopped process (SIGSTOP) answers
nothing, and the coordinator's report names it from its own view."""

from __future__ import annotations

import faulthandler
import tempfile
import time
from collections import deque

CAPACITY = 256  # events one process keeps
ANSWER_LINES = 64  # of those, the newest a probe answer carries
MAX_LINE = 200  # characters of one formatted event
# A probe answer is one message header (at most 64 KB, wire.codec.MAX_HEADER_BYTES): the stack
# dump and the lines are cut to fit beside each other.
MAX_STACK_CHARS = 24_000


class FlightRecorder:
    """A bounded ring of (monotonic ns, kind, fields), newest last.

    `waiting` says what the process waits for right now, for a probe to read from another
    thread: None, or a zero-argument callable returning a dict (op, peer, step, range) or
    None, set by whoever starts a blocking wait and cleared when it ends."""

    __slots__ = ("_events", "_clock", "waiting")

    def __init__(self, capacity: int = CAPACITY, clock=time.monotonic_ns):
        self._events: deque = deque(maxlen=capacity)
        self._clock = clock
        self.waiting = None

    def record(self, kind: str, **fields) -> None:
        """One event; `fields` are kept as given (formatted only when read)."""
        self._events.append((self._clock(), kind, fields))

    def __len__(self) -> int:
        return len(self._events)

    def lines(self, last: int | None = None) -> list[str]:
        """The events as text, oldest first, each stamped with its age in seconds (the newest
        `last` only, with a number)."""
        events = _snapshot(self._events)
        if last is not None:
            events = events[-last:] if last > 0 else []
        now = self._clock()
        out = []
        for t, kind, fields in events:
            text = " ".join(f"{k}={_short(v)}" for k, v in fields.items())
            line = f"-{(now - t) / 1e9:8.3f}s {kind} {text}".rstrip()
            out.append(line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "...")
        return out

    def waiting_for(self) -> dict | None:
        """What the process waits for, as the setter of `waiting` describes it."""
        describe = self.waiting
        if describe is None:
            return None
        try:
            found = describe()
        except Exception as exc:  # a description read while the wait changed under it
            return {"op": "?", "note": f"unreadable: {type(exc).__name__}"}
        return found if isinstance(found, dict) else None


def _snapshot(events: deque) -> list:
    """A copy of the deque taken while another thread may append (a copy that raced an append
    is taken again; the copy holds no Python code, so one try almost always does)."""
    for _ in range(8):
        try:
            return list(events)
        except RuntimeError:
            continue
    return []


def _short(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    text = str(v)
    return text if len(text) <= 48 else text[:45] + "..."


def stack_dump(limit: int = MAX_STACK_CHARS) -> str:
    """Every thread's Python stack, as faulthandler writes it (into a temporary file: it
    writes to a file descriptor), cut to `limit` characters."""
    with tempfile.TemporaryFile() as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        raw = f.read(limit + 1)
    text = raw.decode("utf-8", errors="replace")
    return text if len(raw) <= limit else text[:limit] + "\n... (cut)"


def probe_answer(n: int, role: str, flight: FlightRecorder | None) -> dict:
    """The fields of a `stall_answer` to probe `n`: bounded to fit one message header."""
    fields = {"n": int(n), "role": role, "stack": stack_dump()}
    if flight is not None:
        fields["flight"] = flight.lines(ANSWER_LINES)
        waiting = flight.waiting_for()
        if waiting:
            fields["waiting"] = {str(k)[:32]: _plain(v) for k, v in list(waiting.items())[:8]}
    return fields


def _plain(v):
    """A value msgpack carries and a report prints: numbers, short strings, [lo, hi]."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in list(v)[:8]]
    return str(v)[:120]
