"""A simulated job's membership schedule (`simulate --membership`): workers that join and leave
at given virtual times, as `paramserver worker --join` and a SIGTERM do in a live elastic job.

Pure: the grammar in, a typed schedule out; the engine (sim/core/engine.py) plays it through the
same PolicyHost events the live coordinator sends (Joined(late=True), Left).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paramserver.core.units import UnitError, parse_seconds

MEMBERSHIP_HELP = """\
workers that join and leave in virtual time (seconds since the start barrier), comma-separated:
  join@T           a new worker registers at T: it takes the lowest free rank and joins the
                   policy late (Joined(late=True)): it starts at the policy's next release
                   (under BSP the next round), as `paramserver worker --join` does live
  join@T*N         N workers join at T
  leave@T:wR       worker R gets a preemption notice (SIGTERM) at T: a step under way is
                   finished, pushed and counted, then it leaves; one waiting for a release
                   leaves when the release comes, its step unrun (Left(reason="preempted"))
  leave@T          the same for the highest rank training at T
T is seconds or a time with a unit (30, 30s, 500ms). The job's ranks run up to MAX = --workers
+ the joins (the compute model's classes and the straggler's ranks count over MAX, as a live
--workers MIN:MAX job's do); a change that finds no one to act on (a leave of a rank not
training, anything after the budget is spent) is skipped and noted. E.g.
--membership join@2s*2,leave@5s:w1"""


class MembershipError(ValueError):
    """A --membership value that does not follow the grammar."""


@dataclass(frozen=True)
class Change:
    """One membership change: `kind` "join" or "leave" at virtual time `at`; `worker`: the rank
    a leave names (None: the highest rank training then; always None for a join)."""

    kind: str
    at: float
    worker: int | None = None

    def __post_init__(self):
        if self.kind not in ("join", "leave"):
            raise MembershipError(f"membership change {self.kind!r}: expected join or leave")
        if not (isinstance(self.at, (int, float)) and math.isfinite(self.at) and self.at >= 0):
            raise MembershipError(f"membership change at {self.at!r}: expected a time >= 0")
        if self.worker is not None and (self.kind == "join" or self.worker < 0):
            raise MembershipError(f"membership change {self.kind} names worker "
                                  f"{self.worker!r}: only a leave names a rank (>= 0)")

    def text(self) -> str:
        rank = "" if self.worker is None else f":w{self.worker}"
        return f"{self.kind}@{self.at:g}s{rank}"


@dataclass(frozen=True)
class Schedule:
    """The changes in time order (ties keep the order given)."""

    changes: tuple[Change, ...] = ()

    def __post_init__(self):
        ordered = tuple(sorted(self.changes, key=lambda c: c.at))  # sorted() is stable
        object.__setattr__(self, "changes", ordered)

    def __bool__(self) -> bool:
        return bool(self.changes)

    @property
    def joins(self) -> int:
        return sum(c.kind == "join" for c in self.changes)

    def text(self) -> str:
        return ",".join(c.text() for c in self.changes)

    def to_dict(self) -> list[dict]:
        return [{"kind": c.kind, "at": c.at, "worker": c.worker} for c in self.changes]


def _rank(text: str, item: str) -> int:
    raw = text.strip().removeprefix("w")
    if not raw.isdigit():
        raise MembershipError(f"membership {item!r}: expected leave@T:wRANK, e.g. "
                              f"leave@60s:w1, got rank {text!r}")
    return int(raw)


def _time(text: str, item: str) -> float:
    try:
        return parse_seconds(text, "time")
    except UnitError as exc:
        raise MembershipError(f"membership {item!r}: {exc}") from None


def parse_membership(text: str | None) -> Schedule:
    """`join@T[*N]` and `leave@T[:wR]`, comma-separated (MEMBERSHIP_HELP); '' or none: empty."""
    raw = (text or "").strip()
    if raw.lower() in ("", "none"):
        return Schedule()
    changes: list[Change] = []
    for item in (p.strip() for p in raw.split(",")):
        kind, at, rest = item.partition("@")
        kind = kind.strip()
        if not at or kind not in ("join", "leave"):
            raise MembershipError(f"membership {item!r}: expected join@T, join@T*N or "
                                  f"leave@T[:wRANK], e.g. join@30s,leave@60s:w1")
        if kind == "join":
            when, star, count = rest.partition("*")
            n = 1
            if star:
                if not count.strip().isdigit() or int(count) < 1:
                    raise MembershipError(f"membership {item!r}: join@T*N needs a whole "
                                          f"N >= 1")
                n = int(count)
            t = _time(when, item)
            changes += [Change("join", t) for _ in range(n)]
        else:
            when, colon, rank = rest.partition(":")
            changes.append(Change("leave", _time(when, item),
                                  _rank(rank, item) if colon else None))
    return Schedule(tuple(changes))
