"""A clipped round on one shard: `DistributedOptimizer.clip_grad_norm_` in round mode.

DDP clips the averaged gradient by its norm over the whole model; here the average is summed
on each shard, so no shard knows the norm alone. A round whose pushes ask for clipping
(`clip`: [max_norm, norm_type]) is therefore held once it would be applied: the shard sends
the coordinator its partial (sum of |g|^p over its keys, or their largest |g| for the inf
norm) and applies the round when the coordinator's factor comes (coordinator/clip_rounds.py),
the sum scaled by it. A round no push asked to clip is applied as it always was: no message,
no wait.

Every wait is bounded: the partial goes again every heartbeat interval (a restarted
coordinator knows nothing of it), and past `pull_timeout` (when the workers' pulls waiting for
this round give up anyway) the round is applied unclipped and the log says so. The ranks of a
round must agree on the setting: a push that differs from the round's first is refused,
naming both. Pure: times come in events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paramserver.core import clipping
from paramserver.server.events import ClipFactor, Log, TimePassed, ToCoordinator
from paramserver.server.store import StoreError

INF = math.inf
NONFINITE = -1.0  # the partial of a round whose norm is inf or nan (the wire takes no such)


def clip_setting(value) -> tuple[float, float] | None:
    """A push's `clip` field (checked by the wire already; a core driven by hand is not)."""
    try:
        return clipping.setting(value)
    except ValueError as exc:
        raise StoreError(str(exc)) from None


@dataclass
class _Held:
    step: int
    partial: float
    resend_at: float | None = None  # set at the first TimePassed (the core reads no clock)
    give_up_at: float | None = None


class RoundClip:
    """The clipping part of `core` (a ShardCore): the open round's setting, the round held for
    its factor."""

    def __init__(self, core):
        self.core = core
        self.step: int | None = None  # the round the setting is of
        self.setting: tuple[float, float] | None = None
        self.first = ""  # who set it: named when another rank disagrees
        self.held: _Held | None = None
        self.unclipped = 0  # rounds given up on and applied unclipped

    def handlers(self) -> dict:
        return {ClipFactor: self.on_factor}

    # ---- a new backup's state sync ----------------------------------------------------------
    def state(self) -> dict:
        """The open round's setting and a round held for its factor, as JSON: a backup synced
        mid-round asks the round's next pushes the same setting, and applies a held round when
        the forwarded factor comes."""
        h = self.held
        return {"step": self.step, "setting": None if self.setting is None else
                clipping.wire(*self.setting), "first": self.first,
                "held": None if h is None else [h.step, h.partial]}

    def load(self, state: dict | None) -> None:
        """The inverse of state() (None: a sync from a primary that sends none)."""
        if not state:
            return
        self.step = None if state["step"] is None else int(state["step"])
        self.setting = clip_setting(state["setting"])
        self.first = str(state["first"])
        held = state["held"]
        # (its resend and give-up times start at this backup's first TimePassed)
        self.held = None if held is None else _Held(int(held[0]), float(held[1]))

    # ---- pushes ---------------------------------------------------------------------------------
    def admit(self, step: int, sender: str, clip) -> None:
        """A dense push of round `step` asking `clip` (a wire value, or None): the round's
        first push sets what the round asks; a push that asks otherwise is refused."""
        setting = clip_setting(clip)
        st = self.core.store
        if st.apply_mode != "round":
            if setting is not None:
                raise StoreError("clip is asked of rounds summed on the servers (bsp, lbbsp); "
                                 "under a policy that applies each push on arrival the worker "
                                 "clips its own gradient")
            return
        if st.last_round is not None and step <= st.last_round:
            return  # late: dropped by the store, it sets nothing
        if st.round_step is None:  # the round's first push
            self.step, self.setting, self.first = step, setting, sender
            return
        if st.round_step != step:
            return  # another round's: the store refuses it
        if self.step != step:  # opened by pushes that asked nothing (this part never saw them)
            self.step, self.setting = step, None
            self.first = next(iter(st.round_batches), "an earlier push")
        if setting != self.setting:
            raise StoreError(f"round {step}: {sender} asks {clipping.said(setting)} but "
                             f"{self.first} asked {clipping.said(self.setting)}: every rank must "
                             f"call clip_grad_norm_ with the same max_norm and norm_type, or "
                             f"none")

    # ---- the round's end ------------------------------------------------------------------------
    def holds(self, step: int) -> list | None:
        """Instructions when round `step` must wait for its factor instead of being applied
        now (its partial to the coordinator, once); None when it is applied as any round."""
        held = self.held
        if held is not None and held.step == step:
            return []  # the coordinator's apply_round after the full round held it
        st = self.core.store
        if self.step != step:
            return None  # another round's word (one applied already, say)
        if self.setting is None or st.round_step != step:
            self.step, self.setting = None, None  # applied as any round: forgotten
            return None
        part = st.round_partial(self.setting[1])
        self.held = _Held(step, part if math.isfinite(part) else NONFINITE)
        return [self._partial()]

    def _partial(self) -> ToCoordinator:
        h = self.held
        return ToCoordinator("clip_partial", {"step": h.step, "partial": h.partial,
                                              "clip": clipping.wire(*self.setting)})

    def on_factor(self, ev: ClipFactor) -> list:
        """The coordinator's factor for a held round: applied, the pulls waiting served. One
        for a round not held (sent again, or after this shard gave up) changes nothing."""
        held = self.held
        if held is None or held.step != ev.step:
            return []
        f = float(ev.factor)
        if not (math.isfinite(f) and 0.0 <= f <= 1.0):
            raise StoreError(f"clip factor must be in [0, 1], got {f}")
        return self._apply(f, [])

    def _apply(self, factor: float, out: list) -> list:
        step = self.held.step
        self.held, self.setting, self.step = None, None, None
        self.core.store.apply_round(step, factor)
        return self.core.serve(out)

    # ---- time -----------------------------------------------------------------------------------
    @property
    def due(self) -> float:
        h = self.held
        return INF if h is None or h.resend_at is None else min(h.resend_at, h.give_up_at)

    def tick(self, ev: TimePassed) -> list:
        h = self.held
        if h is None:
            return []
        now, s = ev.now, self.core.settings
        if h.resend_at is None:
            h.resend_at, h.give_up_at = now + s.heartbeat_interval, now + s.pull_timeout
            return []
        if now >= h.give_up_at:
            self.unclipped += 1
            out = [Log("warning", f"server {self.core.name}: no clip factor for round "
                                  f"{h.step} within {s.pull_timeout:.0f} s; applied unclipped")]
            return self._apply(1.0, out)
        if now >= h.resend_at:
            h.resend_at = now + s.heartbeat_interval
            return [self._partial()]
        return []
