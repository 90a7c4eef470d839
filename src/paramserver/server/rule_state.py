"""The update rule's per-key state as a script's optimizer reads and loads it: the shard's
part for `PullState` and `LoadState` (client/optimizer_state.py maps it to torch's
state_dict). Pure: events in, replies out; the store checks and writes."""

from __future__ import annotations

from paramserver.server.events import LoadState, PullState, Reply
from paramserver.server.store import StoreError


class RuleState:
    """The two requests over the store of `core` (a ShardCore), refused `moved` as any other
    request for keys another shard holds."""

    def __init__(self, core):
        self.core = core

    def handlers(self) -> dict:
        return {PullState: self.pull, LoadState: self.load}

    def pull(self, ev: PullState) -> list:
        core, st = self.core, self.core.store
        if core.outside(ev.lo, ev.hi):
            return [core.moved(ev.to)]
        arrays = st.state_of(ev.lo, ev.hi)
        return [Reply(ev.to, "opt_state", {"names": st.keyed_state(), "rule": st.rule.name,
                                           "version": st.version}, arrays)]

    def load(self, ev: LoadState) -> list:
        core, st = self.core, self.core.store
        if not st.initialized:
            raise StoreError("shard not initialized: a worker must init before loading state")
        if core.outside(ev.lo, ev.hi):
            return [core.moved(ev.to)]
        st.load_state(ev.lo, ev.hi, ev.names, ev.arrays)
        return [Reply(ev.to, "ack", {"version": st.version})]
