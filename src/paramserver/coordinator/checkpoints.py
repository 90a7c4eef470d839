"""The checkpoint part: when to ask the servers for one, and what the coordinator's part records.

`CheckpointSchedule` (checkpoint_schedule.py) keeps the bookkeeping of one checkpoint in flight;
this part decides when one is asked (due by the schedule, none while keys move, one that fell
due while another was written taken as soon as that one commits and the shards hold every
counted step) and which counters the coordinator's part records: those that stand when the
servers are asked, not when the last one has saved (pushes of the next round counted
meanwhile are not in the shards' values, and a resume would skip their samples).
"""

from __future__ import annotations

from paramserver.coordinator.checkpoint_schedule import CheckpointSchedule
from paramserver.coordinator.events import CheckpointUnwritten, ShardSaved, ToServers


class Checkpoints:
    """The checkpoint part of `coord` (a CoordinatorState); `schedule` is the job's."""

    def __init__(self, coord, schedule: CheckpointSchedule):
        self.coord = coord
        self.schedule = schedule
        self.enabled = schedule.enabled

    def handlers(self) -> dict:
        return {ShardSaved: self.on_saved, CheckpointUnwritten: self.on_unwritten}

    def maybe(self, now: float, out: list, final: bool = False) -> None:
        """Ask the servers for a checkpoint if one is due (`final`: the job's last, or its
        initial one, asked whatever the schedule says)."""
        coord, schedule = self.coord, self.schedule
        count = coord.progress
        if not (final or schedule.due(count, now)) or schedule.pending_tag is not None:
            return
        if coord.reshard.running is not None:  # keys on the move: the next due time saves
            return
        tag = f"{count:09d}"
        host, members = coord.host, coord.members
        t_start = coord.barrier.t_start
        state = dict(
            host.resume_state(),
            worker_samples={str(k): v for k, v in coord.budget.worker_samples.items()},
            sync=host.name, num_keys=members.num_keys,
            elapsed_s=0.0 if t_start is None else now - t_start)
        if coord.elastic is not None:
            state["elastic"] = coord.elastic.resume_state()
        if coord.reshard.enabled:  # the parts to read back: servers may have come and gone
            state["servers"] = len(members.roster.servers)
        schedule.begin(tag, [m.rank for m in members.roster.servers.values()], count, now,
                       state)
        out.append(ToServers("checkpoint", {"tag": tag, "dir": str(schedule.root)},
                             members.server_links))

    def on_saved(self, e: ShardSaved, out: list) -> None:
        coord = self.coord
        coord.members.touch(e.src, e.now)
        member = coord.members.roster.servers.get(e.src)
        if member is None:
            return
        schedule = self.schedule
        schedule.shard_saved(member.rank, e.tag, e.failed, e.src, e.now, out)
        if schedule.pending_tag is None and coord.steps.at_rest():
            # One that fell due while this one was written is taken now: the step that would
            # take it may never come (workers that wait for it, the job's last round).
            self.maybe(e.now, out)

    def on_unwritten(self, e: CheckpointUnwritten, out: list) -> None:
        self.schedule.unwritten(e.tag, e.reason, e.now, out)
