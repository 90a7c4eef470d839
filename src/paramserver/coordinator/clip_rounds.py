"""Clipped rounds: the norm of a round's averaged gradient over every shard, and its factor.

A shard holding a round its pushes asked to clip (server/clip_round.py) sends its partial
(sum of |g|^p over its keys, or their largest |g|); once every shard's partial of that round
is in, the total norm gives torch's factor min(1, max_norm / (norm + 1e-6)) and every shard is
told it (`clip_factor`) and applies the round scaled by it. Only clipped rounds come here.

Bounded: a round a shard's partial has not reached within `timeout` s of the first one, or
whose missing shard is no longer a member (dead, drained), is given up: every shard is told
to apply it unclipped (factor 1), and the log says so. Factors decided lately are kept, so a
partial sent again (the factor lost, the coordinator restarted) is answered at once; a
restarted coordinator that never saw the round takes the partials the shards send again
every heartbeat interval. Pure: times come in events.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from paramserver.core import clipping
from paramserver.coordinator.events import AppendEvent, ClipPartial, ToServers, Warn

MAX_OPEN = 64  # clipped rounds waiting for partials at once (BSP has one)
KEPT = 16  # decided factors kept for a shard that asks again


@dataclass
class _Round:
    setting: tuple[float, float]
    deadline: float
    partials: dict[int, float] = field(default_factory=dict)  # shard rank -> partial


class ClipRounds:
    """The clipping part of `coord` (a CoordinatorState)."""

    def __init__(self, coord, timeout: float):
        self.coord = coord
        self.timeout = timeout
        self.open: dict[int, _Round] = {}
        self.decided: OrderedDict[int, float] = OrderedDict()

    def handlers(self) -> dict:
        return {ClipPartial: self.on_partial}

    def next_deadline(self) -> float | None:
        return min((r.deadline for r in self.open.values()), default=None)

    def on_partial(self, e: ClipPartial, out: list) -> None:
        members = self.coord.members
        member = members.roster.servers.get(e.src)
        if member is None or member.link != e.link:
            return  # a backup's (it takes the factor its primary forwards) or a stale copy's
        member.last_seen = e.now
        setting = clipping.setting(e.clip)  # (a ValueError: refused)
        factor = self.decided.get(e.step)
        if factor is not None:  # decided already: this shard asks again
            out.append(ToServers("clip_factor", {"step": e.step, "factor": factor}, (e.link,)))
            return
        r = self.open.get(e.step)
        if r is None:
            if len(self.open) >= MAX_OPEN:
                raise ValueError(f"{len(self.open)} clipped rounds wait for partials already")
            r = self.open[e.step] = _Round(setting, e.now + self.timeout)
        elif setting != r.setting:  # each shard refuses a push that differs: not expected
            out.append(Warn(f"round {e.step}: shard {member.rank} asks "
                            f"{clipping.said(setting)}, another shard "
                            f"{clipping.said(r.setting)}; the first is kept"))
        r.partials[member.rank] = e.partial
        if len(r.partials) >= members.servers_expected and all(
                rank in r.partials for rank in range(members.servers_expected)):
            self._decide(e.step, self._factor(r), out)

    @staticmethod
    def _factor(r: _Round) -> float:
        max_norm, norm_type = r.setting
        parts = r.partials.values()
        if any(p < 0 for p in parts):  # a shard's norm was inf or nan: torch's factor is 0
            return 0.0
        return clipping.factor(clipping.total(parts, norm_type), max_norm)

    def _decide(self, step: int, factor: float, out: list) -> None:
        del self.open[step]
        self.decided[step] = factor
        while len(self.decided) > KEPT:
            self.decided.popitem(last=False)
        out.append(ToServers("clip_factor", {"step": step, "factor": factor},
                             self.coord.members.server_links))

    def check(self, now: float, out: list) -> None:
        """A loop turn: rounds past their time, or waiting for a shard that is gone."""
        members = self.coord.members
        servers = members.roster.servers
        for step in list(self.open):
            r = self.open[step]
            missing = [rank for rank in range(members.servers_expected)
                       if rank not in r.partials]
            gone = [rank for rank in missing if f"s{rank}" not in servers
                    or servers[f"s{rank}"].silent_since is not None]
            if now < r.deadline and not gone:
                continue
            why = (f"shard(s) {gone} gone" if gone else
                   f"no partial from shard(s) {missing} within {self.timeout:.0f} s")
            out.append(Warn(f"clipped round {step}: {why}; the shards apply it unclipped"))
            out.append(AppendEvent(now, "clip_given_up", {"step": step, "missing": missing}))
            self._decide(step, 1.0, out)
