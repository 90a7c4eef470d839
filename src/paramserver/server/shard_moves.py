"""The shard's part for what changes which shard it is: a committed reshard (`Rebuild`), the
shard map it learns (`LayoutKnown`), a new backup's whole state from its primary (`LoadSync`).
The core's resharding part (server/resharding.py) hands it the Rebuild of a commit, the node's
replica link (server/replica_link.py) a sync; the core stays the one object its node holds.
Pure: events in, instructions out."""

from __future__ import annotations

import numpy as np
import torch

from paramserver.server.events import LayoutKnown, LoadSync, Rebuild
from paramserver.server.replication import read_sync

_NOTHING = ()


class ShardMoves:
    """The three events over `core` (a ShardCore): its range-bound parts made anew on the new
    range (ShardCore.on_range) or every part anew (ShardCore.fresh), then filled."""

    def __init__(self, core):
        self.core = core

    def handlers(self) -> dict:
        return {Rebuild: self.rebuild, LayoutKnown: self.layout_known, LoadSync: self.load_sync}

    def rebuild(self, ev: Rebuild) -> list:
        """The shard after reshard `ev.epoch`, in place: the parts bound to the range new (the
        values from the assembly), the dedup table and the counters kept (a retry of a push
        applied here is still answered once), the pulls that waited here handled anew (served,
        kept or `moved`)."""
        core = self.core
        old, waiting = core.store, list(core.pulls.reached(float("inf")))
        counters = core.tables.counters()
        floor = max(ev.version_floor, old.version)
        core.on_range(ev.settings)
        st = core.store
        if ev.assembly is not None:
            ev.assembly.install(st, floor)
            if ev.assembly.rows is not None:
                core.tables.gather(ev.assembly.rows.bundles, counters)
        else:
            st.version, st.initialized = floor, True
            st.last_round = old.last_round
        st.updates_applied = old.updates_applied
        core.epoch, core.layout = ev.epoch, ev.layout
        out = []
        for pull in waiting:
            out.extend(core.handle(pull))
        return out

    def layout_known(self, ev: LayoutKnown) -> tuple:
        core = self.core
        core.epoch, core.layout = ev.epoch, list(ev.layout)
        core.store.version = max(core.store.version, ev.version)
        return _NOTHING

    def load_sync(self, ev: LoadSync) -> tuple:
        """Become the state a primary's sync describes (replication.sync_payload); first, with
        `ev.settings`, a fresh shard of those (a backup now mirroring another shard)."""
        blob, got = read_sync(ev.arrays)
        core = self.core
        if ev.settings is not None:
            core.fresh(ev.settings)
        st = core.store
        if blob["initialized"]:
            st.restore(got, blob["meta"])
        else:  # an init in chunks, part way: the values it set so far
            st.values.copy_(torch.from_numpy(np.array(got["values"])))
        st.load_round_state(blob["round"], got)
        core.clip.load(blob.get("clip"))
        core.tables.restore(got)
        core.tables.load_round(got)
        core.retries.load(blob["applied"])
        core.initial_saved = bool(blob["initial_saved"])
        shard = blob.get("shard") or {}
        if shard.get("layout") is not None:  # (a resharded job's: its `moved` refusals name it)
            core.epoch, core.layout = int(shard.get("epoch") or 0), list(shard["layout"])
        return _NOTHING
