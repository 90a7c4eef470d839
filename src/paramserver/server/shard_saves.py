"""The shard's part for checkpoints: a checkpoint's part written (`Checkpoint`), and the shard
started again from one (`Restore`, the contents server/checkpoint.py read). Pure: events in,
instructions out; the node writes the files (`SaveShard`)."""

from __future__ import annotations

from paramserver.server.events import Checkpoint, Reply, Restore, SaveShard, ToCoordinator
from paramserver.spec.welcome import INITIAL_TAG


class ShardSaves:
    """Checkpoints of `core` (a ShardCore): what a part holds (values and version, the rule's
    state, the rows that exist, the replies to the pushes in it) and what a restore brings
    back. Checkpoint 0 holds the initial values: once on disk, no later save replaces it."""

    def __init__(self, core):
        self.core = core

    def handlers(self) -> dict:
        return {Checkpoint: self.checkpoint, Restore: self.restore}

    def checkpoint(self, ev: Checkpoint) -> list:
        core = self.core
        saved = Reply(ev.to, "saved", {"tag": ev.tag, "version": core.store.version})
        if ev.tag == INITIAL_TAG and core.initial_saved:
            return [saved]  # it holds the initial values; pushes since must not overwrite them
        return [self.save(ev.tag, ev.dir, saved)]

    def save(self, tag: str, directory: str, done: Reply | None = None) -> SaveShard:
        core = self.core
        arrays, meta = core.store.snapshot()
        arrays.update(core.tables.snapshot())  # only the rows that exist
        meta["applied"] = core.retries.dump()  # the retries of saved pushes stay answered
        return SaveShard(tag, directory, arrays, meta, done)

    def restore(self, ev: Restore) -> list:
        core = self.core
        if ev.fresh:  # (the shard map a resharded job's sync named stays known)
            epoch, layout = core.epoch, core.layout
            core.fresh(core.settings)
            core.epoch, core.layout = epoch, layout
        core.initial_saved = core.initial_saved or ev.tag == INITIAL_TAG
        core.lost_updates = core.store.restore(ev.arrays, ev.meta, ev.version_floor)
        core.refs.values_replaced()  # (the version may not move: see server/deltas.py)
        core.tables.restore(ev.arrays)
        # The pushes in the checkpoint stay applied once: their retries are answered.
        core.retries.load(ev.meta.get("applied", []))
        out = core.serve([])
        if ev.announce:  # back after a crash: the coordinator counts what was lost
            out.append(ToCoordinator("restored", {
                "tag": ev.tag, "lost_updates": core.lost_updates,
                "version": core.store.version}))
        return out
