"""Which workers a job had when its coordinator died, read back by the one restarted in its
place. An elastic job's take-back waits for the members, not for its MAX workers (`--workers
MIN:MAX` runs with any number between, and a rank nobody holds never re-registers: waiting for
it would cost every take-back its whole deadline). A fixed job's waits for every rank but those
that left on their own word (a bye, a leaving clock): such a worker finished or was preempted,
and neither comes back nor is replaced; a rank declared dead may be (its replacement takes it).
Pure: the node reads events.jsonl and hands the records over, as it does for ReplicaHistory.

The coordinator writes a line for every change of its roster (events.jsonl is line-buffered:
a written line survives the process): `worker_registered` (a rank given), `worker_left` (a
rank gone: done, preempted, dead), `worker_taken_back` (a rank back to a restarted
coordinator) and `taken_back` (a take-back's rebuild, with the ranks it rebuilt on: those that
did not come back are no members any more). `start` begins a new job in the run folder.
"""

from __future__ import annotations

from paramserver.coordinator.log_fold import LogFold

# The events that change the roster's worker ranks; the rest of the log is skipped.
KINDS = frozenset({"start", "worker_registered", "worker_taken_back", "worker_left",
                   "taken_back"})


class WorkerHistory(LogFold):
    """The worker ranks that were members when the log ends (`ranks`; None when the log holds
    no `start`: nothing to go by, the caller expects every rank), and of the others those whose
    last word was their own leave (`left`)."""

    kinds = KINDS

    def __init__(self, ranks: set[int] | None = None, left: set[int] = frozenset()):
        self.ranks = None if ranks is None else set(ranks)
        self.left = set(left)

    def _take(self, r: dict) -> None:
        kind = r["event"]
        if kind == "start":  # a new job in this run folder (a resume): its roster starts empty
            self.ranks, self.left = set(), set()
            return
        if self.ranks is None:
            return
        if kind == "taken_back":
            ranks = r.get("ranks")
            if isinstance(ranks, list) and all(_rank(x) for x in ranks):
                self.ranks = set(ranks)  # (without it: those back were added as they came)
            return  # (`left` holds: who left before an earlier take-back is gone still)
        rank = r.get("worker" if kind == "worker_left" else "rank")
        if not _rank(rank):
            return
        if kind == "worker_left":
            self.ranks.discard(rank)
            # "dead" is the coordinator's word (silence); every other reason the worker's own
            if r.get("reason") != "dead":
                self.left.add(rank)
        else:  # (a rank taken again, by a new worker of a fixed job: a member once more)
            self.ranks.add(rank)
            self.left.discard(rank)


def _rank(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
