"""auto: the policy in force follows the stragglers while the job runs.

AutoSync is a SyncPolicy that hosts one candidate policy at a time (by default lbbsp, which
starts, bsp, ssp and asp: asp is the one that does not wait for a worker whose every step
carries a fixed cost, such as its own slow link, which no batch split can balance; its pushes
are scaled as ssp's, below, and it is chosen only where its throughput beats the lockstep
ones' by more than its staleness costs in samples) and
a SwitchController that forecasts them all from the workers' recent pace. When the controller
proposes another candidate, AutoSync drains: it lets no worker start a new step until every
step in flight has pushed, so that no push of the old policy meets the new one. Then it builds
the new candidate, joins every active worker to it at once and goes on. Nothing is lost or
applied twice: each push was acknowledged by every shard before the policy heard of it, and
the workers' step numbers go on where they were (each candidate counts its own steps from 0;
AutoSync adds each worker's offset).

Every candidate runs with the servers in arrival mode, so a switch never changes what the
servers are. The lockstep candidates' (bsp, lbbsp) releases name their round (`round_id`,
numbered from 1 over the whole job): the shards sum that round's pushes and apply their
batch-weighted average once, as round mode does, so any update rule (momentum and adam included)
takes one step a round, as under the fixed policy. The round is applied when its last push is in
(every release names the round's size); a round closed without it (a worker left) is applied at
the ApplyRound the candidate decides, which AutoSync passes on with the round's id, as it does
for the round open at a switch. ssp and asp scale each push by batch / (N x the job's batch), so
that N pushes move the parameters as far as a round does: the learning rate means the same under
every candidate (fixed ssp and asp get that from DynSGD, which compare pairs them with;
unscaled, auto's ssp diverged at compare's lr). Beside a staleness-aware rule (dynsgd),
`discount=rule` leaves ssp's and asp's pushes unscaled for the rule to discount, as it does for
the fixed policies; the lockstep rounds' pushes read staleness 0 and stay whole.

Each switch is a Note("sync_switch") with its reason, the predicted gain, the forecast of every
candidate and how long the drain took; the event log, `top` and the report read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from paramserver.core.options import Configurable, check_int, check_range, opt
from paramserver.policies.asp import ASP
from paramserver.policies.base import (
    ApplyRound, Decision, Joined, Left, Note, Pushed, Release, SyncPolicy, Tick,
)
from paramserver.policies.bsp import BSP
from paramserver.policies.forecast import CANDIDATES, SHIPPED, SamplesCurve
from paramserver.policies.lbbsp import LBBSP
from paramserver.policies.pace import PaceBook
from paramserver.policies.ssp import SSP
from paramserver.policies.switching import Proposal, SwitchController
from paramserver.predict.convergence import ConvergenceModel


DISCOUNTS = ("share", "rule")


@dataclass(frozen=True)
class AutoOptions:
    candidates: str = opt("lbbsp,bsp,ssp,asp",
                          "policies to choose among, comma-separated, of "
                          f"{', '.join(CANDIDATES)}; the first one starts")
    interval: float = opt(2.0, "seconds between decisions once the windows are full, and the "
                               "least a policy holds")
    margin: float = opt(0.15, "predicted gain a switch must beat (0.15: a forecast 1.15x as fast)")
    horizon: float = opt(20.0, "seconds over which a switch's gain must repay its drain")
    window: int = opt(16, "recent steps of each worker the forecast reads")
    staleness: int = opt(3, "ssp's bound while ssp is in force")
    discount: str = opt("share", "how ssp's and asp's pushes are weighted: share (batch / (N x "
                                 "the job's batch), what plain sgd needs) or rule (as they "
                                 "come, for a staleness-aware update rule such as dynsgd to "
                                 "discount; the default beside one)")

    def __post_init__(self):
        names = self.names()
        unknown = [n for n in names if n not in CANDIDATES]
        if not names or unknown:
            raise ValueError(f"candidates must name some of {', '.join(CANDIDATES)}; got "
                             f"{self.candidates!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"candidates names a policy twice: {self.candidates!r}")
        check_range("interval", self.interval, 0, lo_open=True)
        check_range("margin", self.margin, 0)
        check_range("horizon", self.horizon, 0, lo_open=True)
        check_int("window", self.window, 1)
        check_int("staleness", self.staleness, 0)
        if self.discount not in DISCOUNTS:
            raise ValueError(f"discount must be one of {', '.join(DISCOUNTS)}; got "
                             f"{self.discount!r}")

    def names(self) -> tuple[str, ...]:
        raw = self.candidates
        parts = raw.split(",") if isinstance(raw, str) else list(raw)
        return tuple(str(p).strip() for p in parts if str(p).strip())


class AutoSync(SyncPolicy, Configurable):
    """The candidate in force, switched at drained points when the forecast says so."""

    name = "auto"
    apply_mode = "arrival"
    sums_rounds = True
    Options = AutoOptions
    # advise reads each candidate's stretch of the simulated run against its own samples to
    # target (advise.core.recommend): auto ranks with its defaults.
    advise_options = ((),)
    calibrated = False

    def __init__(self, batch_size: int, *, candidates: str = "lbbsp,bsp,ssp,asp",
                 interval: float = 2.0, margin: float = 0.15, horizon: float = 20.0,
                 window: int = 16, staleness: int = 3, discount: str = "share",
                 model: ConvergenceModel | None = None):
        """`model`: the samples-to-target model the forecasts use (default: the shipped
        calibration's apply-mode references)."""
        super().__init__(batch_size)
        self.options = AutoOptions(candidates, interval, margin, horizon, window, staleness,
                                   discount)
        names = self.options.names()
        # Steps each worker needs before a forecast: a chronic straggler shows in four (in two,
        # one worker's two spikes look chronic), and every look before the first switch is
        # time spent in the first candidate; the margin is wider while the window fills.
        least = min(window, max(2, window // 4))
        self.pace = PaceBook(window, least)
        self.controller = SwitchController(names, interval, margin, horizon,
                                           SamplesCurve.of(model or SHIPPED), least, window)
        self.current = names[0]
        self.inner = self._build(self.current)
        self.own_batches = self.inner.own_batches
        self.offset: dict[int, int] = {}  # a worker's steps = the candidate's + offset
        self.next_step: dict[int, int] = {}  # the step each worker is at (last pushed + 1)
        self.running: set[int] = set()  # released, its push not in yet
        self.pending: tuple[Proposal, float] | None = None  # a switch draining, since when
        # Lockstep rounds: the id of the candidate's round 0, the last id released, and the
        # workers whose push of the open round came in.
        self.round_base = 1
        self.last_round_id = 0
        self.in_round: set[int] = set()
        self.summed = 0  # pushes of lockstep rounds, all told
        self.switches = 0
        self._started = False
        self._gathered: list[Decision] | None = None  # the candidate's, inside handle_all

    # ---- events ---------------------------------------------------------------------------------
    def handle_all(self, joins: list[Joined]) -> list[Decision]:
        """The start: the candidate hears every join before a release goes out, so a lockstep
        round's size counts every worker."""
        self._gathered = []
        try:
            out = [d for e in joins for d in self.handle(e)]
            gathered = self._gathered
        finally:
            self._gathered = None
        return out + self._out(gathered, joins[0].now) if joins else out

    def on_joined(self, event: Joined) -> list[Decision]:
        out: list[Decision] = []
        if not self._started:
            self._started = True
            out.append(Note("sync_switch", {"from": None, "to": self.current,
                                            "reason": "the first candidate starts"}))
        if self.pending is not None:
            return out  # it joins the next candidate with everyone when the drain ends
        self.offset[event.worker] = 0
        self.inner.global_batch = self.global_batch
        if self.running and isinstance(self.inner, BSP):
            # A lockstep round in progress told the shards its size without this worker: it
            # starts with the next round (its push would come after the round was applied).
            event = Joined(event.worker, event.now, late=True)
        decisions = self.inner.handle(event)
        if self._gathered is not None:  # inside handle_all: translated with the others'
            self._gathered += decisions
            return out
        return out + self._out(decisions, event.now)

    def on_left(self, event: Left) -> list[Decision]:
        w = event.worker
        self.pace.forget(w)
        self.running.discard(w)
        self.next_step.pop(w, None)
        if self.pending is not None:
            self.offset.pop(w, None)
            return self._switch(event.now) if not self.running else []
        if w not in self.inner.active:
            return []
        self.inner.global_batch = self.global_batch
        out = self._out(self.inner.handle(event), event.now)
        self.offset.pop(w, None)
        return out

    def on_pushed(self, event: Pushed) -> list[Decision]:
        w, now = event.worker, event.now
        self.running.discard(w)
        if isinstance(self.inner, BSP):
            self.in_round.add(w)
            self.summed += 1
        self.pace.pushed(w, now, event.batch_size, event.compute_time)
        self.next_step[w] = event.step + 1
        if (self.pending is None and self.controller.due(now)
                and self.active <= self.pace.known):  # (a set test, not a pass over paces)
            paces = {v: self.pace.pace(v, self.batch_size) for v in sorted(self.active)}
            proposal = self.controller.decide(now, self.current, paces, self.batch_size)
            if proposal is not None:
                self.pending = (proposal, now)
        if self.pending is not None:  # the drain: no step starts until the last is in
            return self._switch(now) if not self.running else []
        inner = Pushed(w, event.step - self.offset[w], now, event.batch_size,
                       event.compute_time, event.cpu_load, event.free_mem)
        return self._out(self.inner.handle(inner), now)

    def on_tick(self, event: Tick) -> list[Decision]:
        if self.pending is not None:
            return []
        return self._out(self.inner.handle(event), event.now)

    def next_deadline(self) -> float | None:
        return None if self.pending is not None else self.inner.next_deadline()

    def summed_steps(self) -> int:
        return self.summed

    def round_size(self) -> int:
        """Under a lockstep candidate, its round's size: each release says it, so that the
        shards apply the round they sum once that many pushed; 0 under ssp and asp."""
        inner = self.inner
        return inner.round_size() if isinstance(inner, BSP) else 0

    # ---- the switch -----------------------------------------------------------------------------
    def _switch(self, now: float) -> list[Decision]:
        proposal, asked = self.pending
        self.pending = None
        was = self.current
        closing: list[Decision] = []
        if isinstance(self.inner, BSP):
            # The drained round (no push of it reached the candidate): applied now, if the
            # shards have not applied it full already (they take the word once).
            if self.in_round:
                closing.append(ApplyRound(self.round_base + self.inner.round,
                                          tuple(sorted(self.in_round))))
                self.in_round = set()
        self.round_base = self.last_round_id + 1
        self.current = proposal.to
        self.inner = self._build(proposal.to)
        self.inner.global_batch = self.global_batch
        self.own_batches = self.inner.own_batches
        self.offset = {w: self.next_step.get(w, 0) for w in self.active}
        if isinstance(self.inner, LBBSP):  # its first round split by the speeds measured
            paces = {w: self.pace.pace(w, self.batch_size) for w in self.active}
            self.inner.warm({w: 1 / p.per_sample for w, p in paces.items()
                             if p is not None and p.per_sample > 0})
        self.switches += 1
        self.controller.took_over(now, was, proposal.to)
        note = Note("sync_switch", {
            "from": was, "to": proposal.to, "reason": proposal.reason,
            "gain": round(proposal.gain, 4), "asked_at": asked,
            "drain_s": round(now - asked, 6),
            "forecast": {c: o.to_dict() for c, o in proposal.outlooks.items()}})
        decisions: list[Decision] = []
        for w in sorted(self.active):
            decisions += self.inner.handle(Joined(w, now))
        return closing + [note] + self._out(decisions, now)

    def _build(self, name: str) -> SyncPolicy:
        b = self.batch_size
        return {"bsp": lambda: BSP(b), "lbbsp": lambda: LBBSP(b), "asp": lambda: ASP(b),
                "ssp": lambda: SSP(b, staleness=self.options.staleness)}[name]()

    def _out(self, decisions: list[Decision], now: float) -> list[Decision]:
        """The candidate's decisions as the host gets them: steps in the workers' numbering;
        a lockstep round's releases and ApplyRound named by the round's id, the other
        candidates' pushes scaled (below)."""
        out: list[Decision] = []
        lockstep = isinstance(self.inner, BSP)
        share = None
        for d in decisions:
            kind = type(d)
            if kind is Release:
                w = d.worker
                self.running.add(w)
                self.pace.released(w, now if d.not_before is None else max(now, d.not_before))
                step = d.step + self.offset.get(w, 0)
                if lockstep:
                    rid = self.round_base + d.step
                    if rid > self.last_round_id:
                        self.last_round_id = rid
                    out.append(Release(w, step, d.batch_size, d.not_before, d.scale,
                                       round_id=rid))
                    continue
                if share is None:
                    share = self._step_samples()
                out.append(Release(w, step, d.batch_size, d.not_before,
                                   d.scale * d.batch_size / share))
            elif kind is ApplyRound:
                self.in_round = set()
                out.append(ApplyRound(self.round_base + d.step, d.contributors))
            else:
                out.append(d)
        return out

    def _step_samples(self) -> int:
        """What an ssp or asp push is scaled against: the samples of one step of every
        worker, so that N pushes move the parameters as far as one round does and no
        candidate runs at N times another's step size (fixed ssp is paired with DynSGD for
        that), or, beside such a rule (discount=rule), one step's."""
        if self.options.discount == "rule":  # the servers' rule discounts them by staleness
            return self.batch_size
        return max(self.batch_size * len(self.active), 1)

    # ---- checkpoints ----------------------------------------------------------------------------
    def resume_state(self) -> dict:
        return {"current": self.current, "inner": self.inner.resume_state(),
                "switches": self.switches, "round_base": self.round_base,
                "last_round_id": self.last_round_id, "summed": self.summed}

    def resume(self, state: dict) -> None:
        current = state.get("current", self.current)
        if current not in self.controller.candidates:
            raise ValueError(f"the checkpoint's policy {current!r} is not among the candidates "
                             f"{', '.join(self.controller.candidates)}")
        self.current = current
        self.inner = self._build(current)
        self.own_batches = self.inner.own_batches
        self.inner.resume(state.get("inner", {}))
        self.switches = int(state.get("switches", 0))
        self.round_base = int(state.get("round_base", 1))
        self.last_round_id = int(state.get("last_round_id", 0))
        self.summed = int(state.get("summed", 0))
