"""Refusals logged at a bounded rate: the first few per source and window, then one summary.

A flood of bad frames must cost the role a bounded amount of log, not a line per frame (10 s
of garbage once wrote 4.4 MB of log). Every role's node owns one RefusalLog and says what it
refused; this class decides which lines are written. Pure: the clock and the writer of lines
are injected, so a test drives it with a fake clock and a list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# Refusals from senders beyond `max_sources` in one window are counted under this name, so a
# flood from ever new identities cannot grow the table either.
OTHERS = "other peers"
# A refusal's reason may quote the sender's bytes (a 60 KB "protocol version"): lines are cut.
MAX_LINE = 400


@dataclass
class _Window:
    start: float
    logged: int = 0
    suppressed: int = 0


class RefusalLog:
    """At most `burst` lines per source per `window` s; when a window with lines held back
    ends, one line "refused K more frames from X in the last T s". Summaries are written by
    the next refusal or by flush(), which a node calls once per loop turn (cheap when none is
    due)."""

    def __init__(self, emit: Callable[[str], None], clock: Callable[[], float],
                 burst: int = 5, window: float = 10.0, max_sources: int = 16):
        if burst < 1 or window <= 0 or max_sources < 1:
            raise ValueError("RefusalLog needs burst >= 1, window > 0 and max_sources >= 1")
        self.emit, self.clock = emit, clock
        self.burst, self.window, self.max_sources = burst, window, max_sources
        self.windows: dict[str, _Window] = {}
        self.total = 0  # refusals since start, logged or not
        self._due = float("inf")  # the earliest end of an open window

    def refused(self, source: str, line: str) -> None:
        """`source` (who sent it) had a frame or request refused; `line` says so (it is
        written if this source's burst allows)."""
        now = self.clock()
        self.total += 1
        if now >= self._due:
            self._close(now)
        w = self.windows.get(source)
        if w is None:
            if len(self.windows) >= self.max_sources:
                source = OTHERS
                w = self.windows.get(source)
            if w is None:
                w = self.windows[source] = _Window(now)
                self._due = min(self._due, now + self.window)
        if w.logged < self.burst:
            w.logged += 1
            self.emit(line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "...")
        else:
            w.suppressed += 1

    def flush(self) -> None:
        """Write the summaries of windows that have ended."""
        now = self.clock()
        if now >= self._due:
            self._close(now)

    def _close(self, now: float) -> None:
        due = float("inf")
        for source in list(self.windows):
            w = self.windows[source]
            if now - w.start < self.window:
                due = min(due, w.start + self.window)
                continue
            del self.windows[source]
            if w.suppressed:
                self.emit(f"refused {w.suppressed} more frames from {source} in the last "
                          f"{now - w.start:.0f} s")
        self._due = due
