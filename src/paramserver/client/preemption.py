"""SIGTERM as a preemption notice (spot capacity taken back) in an elastic job's worker: the
worker finishes the step it is in, push included, and leaves the job cleanly (its last clock
says so) instead of dying mid-push. Used by the built-in train task and DistributedOptimizer."""

from __future__ import annotations

import signal
import threading


class Preemption:
    """Catches SIGTERM while installed; `given` turns True when it came. Only the main thread
    may install a handler: elsewhere this watches nothing (and says so in `installed`)."""

    def __init__(self):
        self.given = False
        self.installed = threading.current_thread() is threading.main_thread()
        self._before = signal.signal(signal.SIGTERM, self._notice) if self.installed else None

    def _notice(self, signum, frame) -> None:
        self.given = True

    def restore(self) -> None:
        if self.installed:
            signal.signal(signal.SIGTERM, self._before)
            self.installed = False
