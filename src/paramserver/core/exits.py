"""The exit codes of every paramserver process, one table an orchestrator can act on.

Kubeflow's ExitCode restart policy reads 1-127 as permanent (fix something, then resubmit) and
128-255 as retryable (the same pod again may well succeed); Kubernetes' podFailurePolicy and a
Slurm batch script can match the same numbers. So a role says which kind of end it had; the
table with what an orchestrator should do on each is docs/multihost.md's "Exit codes" (a test
holds it to this enum). PREEMPTED is 128 + SIGTERM, what a shell reports for a process SIGTERM
ended; PEER_LOST is 128 + 75 (sysexits' EX_TEMPFAIL): no signal has that number, so it is
never read as one. Pure: names and numbers, no I/O.
"""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    FINISHED = 0
    FAILED = 1
    REFUSED = 2
    INTERRUPTED = 130
    PREEMPTED = 143
    PEER_LOST = 203


MEANING = {
    Exit.FINISHED: "finished",
    Exit.FAILED: "failed: an unexpected error (see its traceback)",
    Exit.REFUSED: "refused its input (fix it and run again)",
    Exit.INTERRUPTED: "interrupted",
    Exit.PREEMPTED: "preempted: drained on SIGTERM and left (may rejoin)",
    Exit.PEER_LOST: "lost a peer it needs (retryable: resumes from its checkpoint)",
}


class PeerLost(Exception):
    """A role gives up because a peer it needs is gone; it ends with Exit.PEER_LOST, saying
    why in one line."""


class Refused(Exception):
    """A role cannot go on with what it was given (a port taken, a checkpoint it cannot
    start from, a peer that will not take it); it ends with Exit.REFUSED, saying why."""


def retryable(code: int | None) -> bool:
    """Whether running the process again may succeed (Kubeflow's rule: 128-255), counting a
    process a signal ended (a negative code from subprocess) as retryable too."""
    return code is not None and (code < 0 or 128 <= code <= 255)


def server_left(code: int | None) -> bool:
    """Whether a server process ended as a finished or drained one (drained on SIGTERM:
    PREEMPTED), not as a dead one a launcher must restart or end the job for."""
    return code in (Exit.FINISHED, Exit.PREEMPTED)


def own(code: int | None) -> bool:
    """Whether the process ended on its own terms, with a code of this table (one a signal
    killed did not)."""
    return code is not None and code in Exit._value2member_map_


def describe(code: int | None) -> str:
    """`code` in words, for a launcher's message."""
    if code is None:
        return "still running"
    if code < 0:
        return f"signal {-code}"
    known = Exit._value2member_map_.get(code)
    return f"exit code {code}" + (f" ({MEANING[known]})" if known is not None else "")
