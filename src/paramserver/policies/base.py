"""Sync-policy interface: events in, decisions out; a pure state machine with the time inside events."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Union

ApplyMode = Literal["arrival", "round"]


# ---- events: what the coordinator (or the simulator) tells a policy -----------------------------

@dataclass(frozen=True)
class Joined:
    """Worker `worker` registered and waits for its first release. `late`: it joins a job
    already running (an elastic join), not at the start barrier: a round-mode policy then
    starts it at the next round, since the round in progress was sized without it."""

    worker: int
    now: float
    late: bool = False


@dataclass(frozen=True)
class Left:
    """Worker `worker` is gone: finished (`reason="done"`) or declared dead."""

    worker: int
    now: float
    reason: str = "done"


@dataclass(frozen=True, init=False)
class Pushed:
    """Worker `worker` finished step `step`: its push is acknowledged by every shard."""

    worker: int
    step: int
    now: float
    batch_size: int
    compute_time: float
    # Exogenous load readings of the worker's host (cpu percent, free memory fraction), for
    # predictors that use them; None when the worker did not measure them.
    cpu_load: float | None = None
    free_mem: float | None = None

    # Written out, as Release's: one per worker step.
    def __init__(self, worker: int, step: int, now: float, batch_size: int,
                 compute_time: float, cpu_load: float | None = None,
                 free_mem: float | None = None):
        fields = self.__dict__
        fields["worker"] = worker
        fields["step"] = step
        fields["now"] = now
        fields["batch_size"] = batch_size
        fields["compute_time"] = compute_time
        fields["cpu_load"] = cpu_load
        fields["free_mem"] = free_mem


@dataclass(frozen=True)
class Tick:
    """Time passes; policies with timed decisions may act."""

    now: float


Event = Union[Joined, Left, Pushed, Tick]


# ---- decisions: what a policy asks the runtime to do --------------------------------------------

@dataclass(frozen=True, init=False)
class Release:
    """Let `worker` start step `step` with `batch_size` samples, not before time `not_before`.

    `scale` multiplies the worker's next update on the server (R2SP's batch-ratio scaling).
    A policy fills only these; the PolicyHost fills the rest as the release goes out, from
    what it knows then: `min_version` (rounds applied, in round mode: the version the worker
    must pull at least), `round_size` (the policy's round_size(), 0 if unknown) and `stop`
    (the budget is spent: the worker ends instead of running the step).

    `round_id` (auto's lockstep candidates; 0: none): the lockstep round this step belongs to,
    numbered from 1 across the whole job. Servers that apply on arrival sum a round's pushes
    and apply them once, as round mode does, so a stateful update rule (momentum, adam) sees
    one averaged gradient a round, not N pieces of it.
    """

    worker: int
    step: int
    batch_size: int
    not_before: float | None = None
    scale: float = 1.0
    min_version: int = 0
    round_size: int = 0
    stop: bool = False
    round_id: int = 0

    # Written out because the generated __init__ of a frozen dataclass sets each field through
    # object.__setattr__, at twice the cost, and a simulation makes a Release per worker step.
    # (tests/policies/test_policy_host.py checks that it takes exactly the fields, with their
    # defaults.)
    def __init__(self, worker: int, step: int, batch_size: int, not_before: float | None = None,
                 scale: float = 1.0, min_version: int = 0, round_size: int = 0,
                 stop: bool = False, round_id: int = 0):
        fields = self.__dict__
        fields["worker"] = worker
        fields["step"] = step
        fields["batch_size"] = batch_size
        fields["not_before"] = not_before
        fields["scale"] = scale
        fields["min_version"] = min_version
        fields["round_size"] = round_size
        fields["stop"] = stop
        fields["round_id"] = round_id


@dataclass(frozen=True)
class ApplyRound:
    """Servers apply the batch-weighted average of the pushes of round `step`: round mode's
    rounds, or (from a policy that `sums_rounds`) the lockstep round whose `round_id` is `step`."""

    step: int
    contributors: tuple[int, ...] = ()


@dataclass(frozen=True)
class Note:
    """Something worth recording in the event log (a barrier plan, a batch re-tune...)."""

    kind: str
    data: dict = field(default_factory=dict)


Decision = Union[Release, ApplyRound, Note]


class PolicyError(ValueError):
    """An event that contradicts the policy's state (e.g. a push for a step never released)."""


class SyncPolicy(ABC):
    """Base of every synchronization model.

    `apply_mode` tells servers whether to apply a push on arrival or to aggregate rounds and
    wait for an ApplyRound decision. Subclasses keep all their state in plain attributes so
    that the live coordinator and the simulator drive the very same object.
    """

    name: ClassVar[str] = "?"
    apply_mode: ClassVar[ApplyMode] = "arrival"
    # True for a policy that sizes each worker's batch itself (LB-BSP): under an elastic
    # job's batch rule it splits `global_batch`, and the host leaves its batches as they are.
    own_batches: ClassVar[bool] = False
    # True for an arrival-mode policy whose releases may name a lockstep round (`round_id`,
    # auto's): it also decides ApplyRound for those rounds, which the servers sum.
    sums_rounds: ClassVar[bool] = False
    # What the tools ask of a policy (the registry is their one list of policies):
    # True where a worker may run a bounded number of steps ahead of the slowest (SSP, DSSP):
    # under a persistent straggler the bound binds every step.
    bounded: ClassVar[bool] = False
    # The update rule `compare` pairs the policy with when --optimizer is not given (None:
    # the comparison's own default).
    paired_rule: ClassVar[str | None] = None
    # The option sets `advise` tries by default (each a tuple of (option, value) pairs).
    advise_options: ClassVar[tuple[tuple[tuple[str, object], ...], ...]] = ((),)
    # False for a policy that runs others in turn (auto): `calibrate`'s grid leaves it out,
    # as advise predicts it from the runs of the policies it switches among.
    calibrated: ClassVar[bool] = True

    def __init__(self, batch_size: int):
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.batch_size = batch_size
        self.active: set[int] = set()
        # An elastic job's global batch (policies/batch_rule.py), set by the PolicyHost before
        # each join and leave; None: the policy's own (batch_size per worker).
        self.global_batch: int | None = None

    def handle(self, event: Event) -> list[Decision]:
        if isinstance(event, Joined):
            if event.worker in self.active:
                raise PolicyError(f"worker {event.worker} joined twice")
            self.active.add(event.worker)
            return self.on_joined(event)
        if isinstance(event, Left):
            if event.worker not in self.active:
                return []
            self.active.discard(event.worker)
            return self.on_left(event)
        if isinstance(event, Pushed):
            if event.worker not in self.active:
                raise PolicyError(f"push from unknown or departed worker {event.worker}")
            return self.on_pushed(event)
        if isinstance(event, Tick):
            return self.on_tick(event)
        raise PolicyError(f"unknown event {event!r}")

    def handle_all(self, joins: list[Joined]) -> list[Decision]:
        """Workers joining together (the start barrier opening): by default each in turn. A
        policy whose releases depend on who else is in the round (auto's lockstep shares)
        answers them at once."""
        return [d for e in joins for d in self.handle(e)]

    @abstractmethod
    def on_joined(self, event: Joined) -> list[Decision]: ...

    @abstractmethod
    def on_left(self, event: Left) -> list[Decision]: ...

    @abstractmethod
    def on_pushed(self, event: Pushed) -> list[Decision]: ...

    def on_tick(self, event: Tick) -> list[Decision]:
        return []

    def round_size(self) -> int:
        """How many workers' pushes make up the open round, when that is fixed as workers are
        released into it (0: not known). Servers apply a round once that many pushed."""
        return 0

    def next_deadline(self) -> float | None:
        """Earliest time at which a Tick could produce a decision; None if no timer is needed."""
        return None

    def summed_steps(self) -> int:
        """Of an arrival-mode policy's steps, those whose pushes the servers summed into a
        round (auto's lockstep ones, `round_id`): the shards' version counts each such round
        once, each other step once."""
        return 0

    def resume_state(self) -> dict:
        """JSON-ready state a checkpoint keeps so a resumed job goes on where it stopped."""
        return {}

    def resume(self, state: dict) -> None:
        """Restore what `resume_state` returned (before any worker joins)."""
