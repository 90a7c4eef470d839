"""PolicyHost: the one interpreter of a sync policy's decisions, wherever the policy runs.

A policy only says who may go on, with what, and from when. What follows from that is the same
for the live coordinator, the simulator and the tests' driver, so it lives here once: a release
whose not_before is still ahead is held until then, a policy with a timer is ticked at its
deadline, each ApplyRound raises the version a released worker must pull at least, and once a
sample budget is spent every release that goes out tells its worker to stop.

The host is pure: no I/O, no clock (every time comes in as an argument), no threads, nothing
random. Its caller feeds it events, delivers what comes back (Release, ApplyRound, Note) and
calls advance() when next_wakeup() comes.
"""

from __future__ import annotations

import math
from heapq import heapify, heappop, heappush
from collections.abc import Callable, Iterable
from typing import Union

from paramserver.policies.base import (
    ApplyRound, Decision, Joined, Left, Note, PolicyError, Pushed, Release, SyncPolicy, Tick,
)
from paramserver.policies.batch_rule import BatchRule, BatchTerms

Out = Union[Release, ApplyRound, Note]


class PolicyHost:
    """Owns one SyncPolicy: events in, releases ready to go out, rounds and notes back.

    max_samples: a budget shared by all workers. The push that reaches it is the last step:
    `stopping` turns True before the policy hears of that push, a Note("budget_reached",
    {"samples": n}) comes out first, and every release from then on says stop.

    on_decision(decision, now), if given, sees each decision as the policy makes it, before
    the host acts on it (a held release included, at the time it was decided): for callers
    that watch the policy itself, such as a replay that names what triggered each release.

    PolicyError, for what breaks the protocol as far as the host can see: a release for a
    worker that has not joined (or has left), a second release while one is held, a push from
    a worker whose release is still held, an ApplyRound in arrival mode (but from a policy
    that `sums_rounds`), an unknown decision.
    Whether a release names the step its worker is at is for the caller, who knows the worker.
    """

    def __init__(self, policy: SyncPolicy, max_samples: int | None = None, *,
                 on_decision: Callable[[Decision, float], None] | None = None,
                 batch_rule: BatchRule | None = None):
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples must be >= 1 or None, got {max_samples}")
        self.policy = policy
        self.name: str = policy.name
        self.apply_mode: str = policy.apply_mode
        self.max_samples = max_samples
        self.on_decision = on_decision
        self.rounds_applied = 0
        self.samples_done = 0
        self.steps_done = 0
        self.stopping = False
        self._round_mode = policy.apply_mode == "round"
        self._summed = not self._round_mode and policy.sums_rounds  # auto's lockstep rounds
        # Most policies leave next_deadline() and round_size() as SyncPolicy has them: no
        # timers, and (in arrival mode) releases that go out as made until a stop. The
        # simulator's hot loop then skips those calls and the copy.
        self._timed = type(policy).next_deadline is not SyncPolicy.next_deadline
        self._plain = not self._round_mode and (
            type(policy).round_size is SyncPolicy.round_size)
        self._budget = max_samples or math.inf
        # Held releases by (not_before, order held), and by worker (at most one each).
        self._held: list[tuple[float, int, Release]] = []
        self._held_for: dict[int, Release] = {}
        self._held_seq = 0
        # An elastic job's global-batch rule (None: every release as the policy made it). On
        # each join and leave the host works out the new terms, tells the policy the global
        # batch, notes them ("batch_rule") and sets each release's batch and scale by them.
        self.batch_rule = batch_rule
        self.batch_terms: BatchTerms | None = None
        self._batch_of: dict[int, int] = {}

    @property
    def version(self) -> int:
        """What a worker released now must pull at least: the rounds applied (round mode)."""
        return self.rounds_applied

    def versions(self) -> int:
        """What the shards' versions count: the rounds applied (round mode), else the steps,
        of which those the servers summed into a round (auto's lockstep) count once a round."""
        if self._round_mode:
            return self.rounds_applied
        if self._summed:
            return self.steps_done - self.policy.summed_steps() + self.rounds_applied
        return self.steps_done

    def align_versions(self, versions: int) -> None:
        """After a take-back: the live shards hold `versions`, while the checkpoint the policy
        resumed from predates some of its rounds; a policy that sums rounds counts the rounds
        so that versions() is theirs."""
        if self._summed:
            self.rounds_applied = max(0, versions - (self.steps_done
                                                     - self.policy.summed_steps()))

    # ---- events ---------------------------------------------------------------------------------
    def joined(self, worker: int, now: float, late: bool = False) -> list[Out]:
        """`late`: an elastic join into a running job (see Joined)."""
        out: list[Out] = []
        if self.batch_rule is not None:
            self._rebatch(self.policy.active | {worker}, now, out)
        return self._interpret(self.policy.handle(Joined(worker, now, late)), now, out)

    def joined_all(self, workers: Iterable[int], now: float) -> list[Out]:
        """The start barrier opens: every worker joins before any release goes out, so each
        release already carries the full round size."""
        workers = list(workers)
        out: list[Out] = []
        if self.batch_rule is not None:
            self._rebatch(self.policy.active | set(workers), now, out)
        decisions = self.policy.handle_all([Joined(w, now) for w in workers])
        return self._interpret(decisions, now, out)

    def pushed(self, event: Pushed) -> list[Out]:
        """Count the step, check the budget (this push may be the last step), then tell the
        policy. A push the policy refuses (PolicyError) is not counted."""
        if event.worker in self._held_for:
            raise PolicyError(f"worker {event.worker} pushed step {event.step} while its "
                              f"release is still held")
        was_stopping = self.stopping
        self.samples_done += event.batch_size
        self.steps_done += 1
        out: list[Out] = []
        if not was_stopping and self.samples_done >= self._budget:
            self.stopping = True
            out.append(Note("budget_reached", {"samples": self.samples_done}))
        try:
            decisions = self.policy.handle(event)
        except PolicyError:
            self.samples_done -= event.batch_size
            self.steps_done -= 1
            self.stopping = was_stopping
            raise
        return self._interpret(decisions, event.now, out) if decisions else out

    def counted_again(self, batch_size: int) -> None:
        """A step the policy already had (a clock of a round applied before a coordinator
        restart, re-sent): counted, not pushed to the policy again."""
        self.samples_done += batch_size
        self.steps_done += 1

    def left(self, worker: int, now: float, reason: str = "done") -> list[Out]:
        """The worker is gone; a release still held for it must not reach whoever takes its id
        next, so it is dropped."""
        if self._held_for.pop(worker, None) is not None:
            self._held = [e for e in self._held if e[2].worker != worker]
            heapify(self._held)
        out: list[Out] = []
        if self.batch_rule is not None and worker in self.policy.active and not self.stopping:
            self._rebatch(self.policy.active - {worker}, now, out)
        return self._interpret(self.policy.handle(Left(worker, now, reason)), now, out)

    def _rebatch(self, workers: set[int], now: float, out: list[Out]) -> None:
        """The batch rule's terms for the workers active after a join or leave: set before the
        policy hears of it, so the releases it makes then follow them; recorded as a Note.
        (Not after the budget is spent: the leaves then are the end of the job.)"""
        terms = self.batch_rule.terms(len(workers))
        ranks = sorted(workers)
        self.batch_terms = terms
        self._batch_of = dict(zip(ranks, terms.batches))
        self.policy.global_batch = terms.global_batch or None
        note = Note("batch_rule", {"rule": self.batch_rule.text(), "ranks": ranks,
                                   **terms.to_dict()})
        if self.on_decision is not None:
            self.on_decision(note, now)
        out.append(note)

    def advance(self, now: float) -> list[Out]:
        """Time `now` has come: the held releases due by then go out (in not_before order),
        then the policy is ticked if its deadline has passed."""
        out: list[Out] = []
        held, held_for = self._held, self._held_for
        terms = None
        while held and held[0][0] <= now:
            d = heappop(held)[2]
            del held_for[d.worker]
            if terms is None:
                terms = _PLAIN if self._plain and not self.stopping else self._terms()
            if terms is not _PLAIN or d.min_version or d.round_size or d.stop:
                d = _with_terms(d, terms)
            out.append(d)
        deadline = self.policy.next_deadline() if self._timed else None
        if deadline is not None and deadline <= now:
            self._interpret(self.policy.handle(Tick(now)), now, out)
        return out

    def next_wakeup(self) -> float | None:
        """When advance() has something to do: the earliest held release or the policy's
        deadline, whichever comes first (None: nothing until the next event)."""
        held = self._held
        deadline = self.policy.next_deadline() if self._timed else None
        if held and (deadline is None or held[0][0] < deadline):
            return held[0][0]
        return deadline

    def stop(self) -> None:
        """Stop the job from outside (a time budget, a failure): later releases say stop."""
        self.stopping = True

    def held(self) -> list[Release]:
        """The releases waiting for their not_before, earliest first (as the policy made them)."""
        return [e[2] for e in sorted(self._held)]  # (not_before, order held) never tie

    # ---- checkpoints ----------------------------------------------------------------------------
    def resume_state(self) -> dict:
        """JSON-ready: what a resumed job needs to go on counting where this one stopped."""
        return {"rounds_applied": self.rounds_applied, "samples_done": self.samples_done,
                "steps_done": self.steps_done, "policy": self.policy.resume_state()}

    def resume(self, state: dict) -> None:
        """Restore `resume_state()`, before any worker joins. A budget already spent stops
        the resumed job at its first release."""
        if self.policy.active:
            raise PolicyError("resume() after workers joined")
        self.rounds_applied = int(state["rounds_applied"])
        self.samples_done = int(state["samples_done"])
        self.steps_done = int(state["steps_done"])
        self.policy.resume(state.get("policy", {}))
        self.stopping = self.stopping or self.samples_done >= self._budget

    # ---- decisions ------------------------------------------------------------------------------
    # The simulator runs this for every worker step: the common case (a release that goes out
    # as the policy made it) costs no call.
    def _interpret(self, decisions: list[Decision], now: float, out: list[Out]) -> list[Out]:
        watch, active, held_for = self.on_decision, self.policy.active, self._held_for
        terms = None  # what the releases going out now carry (see _terms)
        for d in decisions:
            if watch is not None:
                watch(d, now)
            kind = type(d)
            if kind is Release:
                if self.batch_rule is not None:
                    d = self._by_rule(d)
                w, nb = d.worker, d.not_before
                if w not in active:
                    raise PolicyError(f"t={now}: {d} for a worker that has not joined or has "
                                      f"left")
                if w in held_for:
                    raise PolicyError(f"t={now}: {d} while the release {held_for[w]} is still "
                                      f"held")
                if nb is not None and nb > now:
                    self._held_seq += 1
                    heappush(self._held, (nb, self._held_seq, d))
                    held_for[w] = d
                    continue
                if terms is None:
                    terms = _PLAIN if self._plain and not self.stopping else self._terms()
                if terms is not _PLAIN or d.min_version or d.round_size or d.stop:
                    version, size, stop = terms  # _with_terms, without the call
                    d = Release(w, d.step, d.batch_size, nb, d.scale, version, size, stop,
                                d.round_id)
                out.append(d)
            elif kind is ApplyRound:
                if not (self._round_mode or self._summed):
                    raise PolicyError(f"ApplyRound from the arrival-mode policy {self.name}: {d}")
                self.rounds_applied += 1
                terms = None
                out.append(d)
            elif kind is Note:
                out.append(d)
            else:
                raise PolicyError(f"unknown decision {d!r} from {self.name}")
        return out

    def _by_rule(self, d: Release) -> Release:
        """The release with the batch rule's batch (unless the policy sizes batches itself)
        and its update scaled by the rule's multiplier."""
        terms = self.batch_terms
        batch = d.batch_size
        if not self.policy.own_batches:
            batch = self._batch_of.get(d.worker, batch)
        scale = d.scale * terms.lr_scale if terms is not None else d.scale
        if batch == d.batch_size and scale == d.scale:
            return d
        return Release(d.worker, d.step, batch, d.not_before, scale, d.min_version,
                       d.round_size, d.stop, d.round_id)

    def _terms(self) -> tuple[int, int, bool]:
        """What a release going out now carries: (min_version, round_size, stop)."""
        version = self.rounds_applied if self._round_mode else 0
        size = 0 if self._plain else self.policy.round_size()
        if not (version or size or self.stopping):
            return _PLAIN
        return version, size, self.stopping


_PLAIN = (0, 0, False)  # the terms a Release has by default


def _with_terms(d: Release, terms: tuple[int, int, bool]) -> Release:
    version, size, stop = terms
    return Release(d.worker, d.step, d.batch_size, d.not_before, d.scale, version, size, stop,
                   d.round_id)
