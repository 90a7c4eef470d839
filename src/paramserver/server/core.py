"""The shard's logic as a state machine: events in, instructions out; no sockets, no clock.

ShardCore composes the objects that own the shard's state: ShardStore (values, version,
optimizer state, the round aggregate), ShardTables (the sparse tables and their rows of the
open round), DedupTable (replies to pushes already applied) and PendingPulls (pulls waiting for
a version), and the parts that take events of their own (ShardSaves: checkpoints;
ShardBeats: heartbeats; RuleState, ShardMoves, Resharding). It owns one rule of its own: a
push that makes the round full applies it at once.

Replies that carry views of the live values (range pulls) are sent zero-copy; the node hands
the send's tracker back through lend(). Until then the store does not know the view is out,
so within one event every write to the values comes before the first such reply is made.
"""

from __future__ import annotations

import numpy as np

from paramserver.core.keyspace import KeyRange
from paramserver.optim import make_rule
from paramserver.server.clip_round import RoundClip
from paramserver.server.resharding import Resharding
from paramserver.server.retries import RetryGuard
from paramserver.server.rule_state import RuleState
from paramserver.server.shard_beats import ShardBeats
from paramserver.server.shard_moves import ShardMoves
from paramserver.server.shard_saves import ShardSaves
from paramserver.server.deltas import PullRefs
from paramserver.server.events import (
    ApplyRound, Init, Pull, PullRows, Push, PushRows, PushSparse, Reply, ShardSettings, Shutdown,
    Status, Stop, Then, TimePassed,
)
from paramserver.server.pulls import PendingPulls, TooManyPulls
from paramserver.server.store import PushResult, ShardStore, StoreError
from paramserver.server.tables import ShardTables, placed_elsewhere
from paramserver.spec.welcome import INITIAL_TAG

_NOTHING = ()
_NO_KEYS = np.empty(0, dtype=np.int64)


class ShardCore:
    """One shard of the key space: `handle(event) -> instructions` for its node to carry out."""

    def __init__(self, settings: ShardSettings, alloc=None):
        """`alloc`: see ShardStore (the node's shared-memory buffers for the values)."""
        self.fresh(settings, alloc)
        self._handlers = {
            Push: self._push, PushSparse: self._push_sparse, Pull: self._pull,
            ApplyRound: self._apply_round, TimePassed: self._time_passed, Init: self._init,
            Status: self._status,
            Shutdown: self._shutdown, PullRows: self._pull_rows, PushRows: self._push_rows,
        }
        self.saves = ShardSaves(self)  # (checkpoint 0 at init, below)
        self._handlers.update(self.saves.handlers())
        self._handlers.update(RuleState(self).handlers())
        self._handlers.update(ShardMoves(self).handlers())
        # Kept by name: the node reads whether the shard moves (it holds workers' requests
        # meanwhile), what it waits for and whether it was drained.
        self.resharding = Resharding(self)
        self._handlers.update(self.resharding.handlers())
        self._handlers.update(self.clip.handlers())

    def fresh(self, settings: ShardSettings, alloc=None) -> None:
        """Every part new, for the shard `settings` describe (a new core, or a backup that
        mirrors another shard from its next sync)."""
        self.on_range(settings, alloc)
        # Pushes applied, by (sender, request id): a retry is answered, not applied twice.
        self.retries = RetryGuard(settings.max_unacked_pushes)
        self.refused_pulls = 0  # pulls beyond a client's allowance of waiting ones
        self.lost_updates = 0  # updates a restore from checkpoint could not bring back
        # An elastic-servers job's shard map (server/handoff.py), set at a reshard: a request
        # touching keys outside this shard is refused `moved` with them. None: not known, a
        # request outside is refused as bad input.
        self.epoch = 0
        self.layout: list | None = None
        self.stopped = False
        self.initial_saved = False  # checkpoint 0 on disk (saved at init, or restored from)
        self.beats = ShardBeats(self)
        self.clip = RoundClip(self)  # a round clipped by its norm over every shard

    def on_range(self, settings: ShardSettings, alloc=None) -> None:
        """The parts bound to the shard's rank and key range, new and empty."""
        self.settings = settings
        self.name = f"s{settings.rank}"
        rule = make_rule(settings.optimizer, settings.lr, **settings.optimizer_options)
        self.store = ShardStore(KeyRange(settings.lo, settings.hi), settings.dtype, rule,
                                settings.apply_mode, alloc=alloc)
        self.tables = ShardTables(settings.tables, settings.servers)
        if self.tables:  # a round's rows go with its values, whatever applies the round
            self.store.round_applied = self.tables.apply_round
        self.pulls = PendingPulls(settings.max_pending_pulls)
        self.refs = PullRefs(settings.lo, settings.hi - settings.lo)  # compressed pulls

    def handle(self, event) -> list | tuple:
        """The instructions `event` calls for, in order. A request the shard cannot serve is
        answered with an error reply (code "refused")."""
        try:
            return self._handlers[type(event)](event)
        except (StoreError, ValueError, KeyError, TypeError) as exc:
            to = getattr(event, "to", None)
            if to is None:  # nobody asked: a restore or a clock tick that fails is a bug
                raise
            return [Reply(to, "error", {"msg": str(exc), "code": "refused"})]

    def lend(self, loan) -> None:
        """A reply made with `lend` reads the live values until `loan.done`."""
        self.store.lend(loan)

    def next_wakeup(self) -> float:
        """The event time by which the core wants a TimePassed: the next heartbeat, or the
        earliest deadline of a waiting pull."""
        return min(self.beats.due, self.pulls.next_deadline, self.clip.due)

    # ---- writes ---------------------------------------------------------------------------------
    def _init(self, ev: Init) -> list:
        if self.outside(ev.lo, ev.hi):
            return [self.moved(ev.to)]
        was = self.store.initialized
        took = self.store.init(ev.lo, ev.hi, ev.values)
        out = self.serve([])
        if self.store.initialized and not was and self.settings.initial_checkpoint_dir:
            # Checkpoint 0, on disk before the init's ack: once its initializer goes on, a
            # restart of this shard can always find its initial values.
            out.insert(0, self.saves.save(INITIAL_TAG, self.settings.initial_checkpoint_dir))
            self.initial_saved = True
        out.append(Reply(ev.to, "ack", {"version": self.store.version,
                                        "staleness": 0 if took else -1}))
        return out

    def _push(self, ev: Push) -> list:
        st = self.store
        if not st.initialized:
            raise StoreError("shard not initialized: a worker must init before pushing")
        done = self.retries.retried(ev)
        if done is not None:  # a retry of a push applied before: its ack again, nothing applied
            return [Reply(ev.to, "ack", done)]
        if self.outside(ev.lo, ev.hi):  # after the dedup check, before the table hears of it
            return [self.moved(ev.to)]
        if ev.hyper is not None:  # the script's schedule moved: this push's settings
            st.retune(ev.hyper)
        if ev.clip is not None or self.clip.step is not None:
            self.clip.admit(ev.step, ev.sender, ev.clip)  # (refused: nothing admitted)
        self.retries.admit(ev)
        res = st.push_dense(ev.sender, ev.lo, ev.hi, ev.grad, ev.step, ev.batch, ev.version,
                            ev.scale, ev.round_size, ev.parts, ev.round_id, ev.idle)
        return self._pushed(ev, res)

    def _push_sparse(self, ev: PushSparse) -> list:
        st = self.store
        if not st.initialized:
            raise StoreError("shard not initialized: a worker must init before pushing")
        if ev.keys.dtype != np.int64:
            raise StoreError("sparse keys must be int64")
        done = self.retries.retried(ev)
        if done is not None:  # a retry of a push applied before: its ack again, nothing applied
            return [Reply(ev.to, "ack", done)]
        if self._outside_keys(ev.keys):
            return [self.moved(ev.to)]
        self.retries.admit(ev)
        res = st.push_sparse(ev.sender, ev.keys, ev.grad, ev.step, ev.batch, ev.version,
                             ev.scale, ev.round_size, ev.parts, ev.round_id)
        return self._pushed(ev, res)

    def _push_rows(self, ev: PushRows) -> list:
        """Rows share the shard's version, dedup table and round. In arrival mode they are
        applied now and leave the version alone: it counts the dense updates, which
        staleness-aware rules read, and a step's rows would count twice beside its dense
        values. In round mode, or of a lockstep round (`round_id`), they join the store's round
        as one of the pusher's `parts` (a push of no dense keys) and are applied with it, the
        round advancing the version."""
        st = self.store
        table, grads = self.tables.checked(ev.table, ev.keys, ev.grads)  # refused: nothing done
        done = self.retries.applied_before(ev)
        if done is not None:  # a retry of a push applied before: its ack again, nothing applied
            return [Reply(ev.to, "ack", done)]
        if self._rows_elsewhere(ev.keys):
            return [self.moved(ev.to, rows=True)]
        arrival = st.apply_mode == "arrival"
        if arrival and not ev.round_id:
            st.close_superseded()
            self.tables.apply(table, ev.keys, grads, ev.scale)
            return self._pushed(ev, PushResult(st.version, st.staleness(ev.version)))
        late = not arrival and st.last_round is not None and ev.step <= st.last_round
        # The store counts the part and the batch and refuses a push for another round's step,
        # before the rows are kept.
        res = st.push_sparse(ev.sender, _NO_KEYS, np.empty(0, st.dtype), ev.step, ev.batch,
                             ev.version, ev.scale, ev.round_size, ev.parts, ev.round_id)
        if not late:
            self.tables.add_to_round(ev.table, ev.keys, grads, ev.batch * ev.scale)
        return self._pushed(ev, res)

    # ---- resharding (server/handoff.py) ---------------------------------------------------------
    def outside(self, lo: int, hi: int) -> bool:
        """Keys [lo, hi) reach outside this shard of a known layout (a malformed range is
        left to the store to refuse)."""
        r = self.store.range
        return self.layout is not None and 0 <= lo <= hi and (lo < r.lo or hi > r.hi)

    def _outside_keys(self, keys: np.ndarray) -> bool:
        r = self.store.range
        return (self.layout is not None and keys.size > 0
                and (int(keys.min()) < r.lo or int(keys.max()) >= r.hi))

    def _rows_elsewhere(self, keys: np.ndarray) -> bool:
        """Under a known layout: this server is not in it (drained), or some of `keys` are
        placed on another shard by its server count."""
        if self.layout is None:
            return False
        rank, r = self.settings.rank, self.store.range
        listed = rank < len(self.layout) and list(self.layout[rank][2:4]) == [r.lo, r.hi]
        return not listed or placed_elsewhere(keys, rank, len(self.layout))

    def moved(self, to, rows: bool = False) -> Reply:
        """The refusal of a request for keys another shard holds now: nothing of it applied,
        the layout to find them in."""
        r = self.store.range
        held = (f"the rows that {len(self.layout or ())} servers place on rank "
                f"{self.settings.rank}" if rows else f"keys [{r.lo}, {r.hi})")
        return Reply(to, "error", {
            "msg": f"server {self.name} holds {held} under epoch {self.epoch}: the request's "
                   f"keys moved", "code": "moved", "epoch": self.epoch, "layout": self.layout})

    def _pushed(self, ev, res) -> list:
        fields = {"version": res.version, "staleness": res.staleness}
        self.retries.applied(ev, fields)
        ack = Reply(ev.to, "ack", fields)
        st = self.store
        if st.round_full:
            # The round's last push: apply it now rather than after the coordinator hears every
            # clock and says so, but after its ack has gone, so the pusher's clock is on its way
            # while the shard applies (ApplyRound is idempotent by step).
            return [ack, Then(ApplyRound(None, st.round_step))]
        if not self.pulls:
            return [ack]
        out = self.serve([])  # arrival mode: the push made a version pulls may wait for
        out.append(ack)
        return out

    def _apply_round(self, ev: ApplyRound) -> list:
        # Idempotent by step: a round its last push applied already is not applied again.
        # No reply: the coordinator waits for none, and every message costs both ends CPU.
        if self.clip.step is not None:
            held = self.clip.holds(ev.step)
            if held is not None:  # clipped: applied when the coordinator's factor comes
                return held
        self.store.apply_round(ev.step)  # (a round's rows with it: ShardStore.round_applied)
        return self.serve([])

    # ---- reads ----------------------------------------------------------------------------------
    def _pull(self, ev: Pull) -> list | tuple:
        st = self.store
        if ev.keys is not None and ev.keys.dtype != np.int64:
            raise StoreError("keys must be int64")
        if self.outside(ev.lo, ev.hi) if ev.keys is None else self._outside_keys(ev.keys):
            return [self.moved(ev.to)]
        if st.initialized and st.version >= ev.min_version:
            return [self._values(ev)]  # (reading checks the keys)
        # Refuse bad keys now, not when the pull is finally served.
        if ev.keys is None:
            st.local(ev.lo, ev.hi)
        else:
            st.local_keys(ev.keys)
        self._wait(ev)
        return _NOTHING

    def _wait(self, ev) -> None:
        """Keep a pull until its version comes; refused (and counted) past the client's
        allowance of waiting pulls."""
        try:
            self.pulls.add(ev, ev.now + self.settings.pull_timeout)
        except TooManyPulls:
            self.refused_pulls += 1
            raise

    def _pull_rows(self, ev: PullRows) -> list | tuple:
        """Rows now if the shard has reached min_version; else kept with the waiting pulls,
        which are served once the shard is initialized too (a job inits its dense values
        before it trains)."""
        st = self.store
        self.tables.checked(ev.table, ev.keys)  # refused now, not when finally served
        if self._rows_elsewhere(ev.keys):
            return [self.moved(ev.to, rows=True)]
        if st.version >= ev.min_version:
            return [self._rows(ev)]
        self._wait(ev)
        return _NOTHING

    def _rows(self, ev: PullRows) -> Reply:
        rows = self.tables.pull(ev.table, ev.keys)
        return Reply(ev.to, "rows", {"version": self.store.version}, [rows.reshape(-1)])

    def _values(self, ev: Pull) -> Reply:
        """A range goes straight from the store's buffer, no copy (hence `lend`); keys are
        gathered, already a private copy."""
        st = self.store
        if ev.ref:
            return self._ref_values(ev)
        if ev.keys is None:
            data = st.read(ev.lo, ev.hi, shared=True)
            return Reply(ev.to, "values", {"version": st.version, "range": [ev.lo, ev.hi]},
                         [data.numpy()], lend=True)
        return Reply(ev.to, "values", {"version": st.version}, [st.read_keys(ev.keys).numpy()])

    def _ref_values(self, ev: Pull) -> Reply:
        """A compressed pull's reply (see server/deltas.py): the one a retry got before, else
        the values dense or as a codec-encoded delta from what the worker holds."""
        st = self.store
        kept = self.refs.answered(ev.sender, ev.rid)
        if kept is None:
            if st.dtype != np.float32 or ev.keys is not None:
                raise StoreError("compressed pulls take a key range of float32 values")
            values = st.read(ev.lo, ev.hi, shared=True).numpy()  # read now, not sent
            head = {"version": st.version, "range": [ev.lo, ev.hi]}
            kept = (self.refs.dense(ev.sender, ev.rid, ev.lo, ev.hi, values, head, st.version)
                    if ev.delta is None else
                    self.refs.delta(ev.sender, ev.rid, ev.lo, ev.hi, values, ev.delta, head,
                                    st.version))
        fields, frames = kept
        return Reply(ev.to, "values", fields, frames)

    def serve(self, out: list) -> list:
        """Answer the waiting pulls the shard's version now satisfies (appended to `out`)."""
        if self.pulls and self.store.initialized:
            for pull in self.pulls.reached(self.store.version):
                out.append(self._rows(pull) if type(pull) is PullRows else self._values(pull))
        return out

    def _status(self, ev: Status) -> list:
        st = self.store
        state = {
            "rank": self.settings.rank, "range": [st.range.lo, st.range.hi],
            "version": st.version, "initialized": st.initialized,
            "updates_applied": st.updates_applied, "lost_updates": self.lost_updates,
            **self.retries.counters(), "refused_pulls": self.refused_pulls,
            "late_pushes": st.late_pushes, "copies_on_write": st.copies_on_write,
            "unclipped_rounds": self.clip.unclipped,
            "pending_pulls": len(self.pulls)}
        if self.tables:
            state["tables"] = self.tables.counters()
        return [Reply(ev.to, "state", {"state": state})]

    # ---- checkpoints, time, the end -------------------------------------------------------------
    def _time_passed(self, ev: TimePassed) -> list | tuple:
        now = ev.now
        clip = self.clip.tick(ev) if self.clip.held is not None else _NOTHING
        beat = self.beats.tick(now, ev.busy)
        if beat is None and now < self.pulls.next_deadline:
            return clip
        out = list(clip)
        st = self.store
        for pull in self.pulls.expire(now):
            what = ("initial values" if not st.initialized
                    else f"version {pull.min_version} (at {st.version})")
            out.append(Reply(pull.to, "error", {
                "msg": f"server {self.name} waited {self.settings.pull_timeout:.0f} s for "
                       f"{what}", "code": "timeout"}))
        if beat is not None:
            out.append(beat)
        return out

    def _shutdown(self, ev: Shutdown) -> list:
        self.stopped = True
        return [Stop()]
