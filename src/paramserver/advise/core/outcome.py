"""What one policy does on a fitted cluster at the target scale: the simulator without --train.

The very engine and policy host of `paramserver simulate` (sim.engine), fed by the cluster
model's exact split of a step: compute (base cost x persistent slowdown x mean-1 lognormal noise
x a transient factor, drawn per worker and step from seeded generators) plus the worker's own
link time (not multiplied by any straggler factor, not shared with other workers), while the
servers' serial handling queues across workers on the engine's links. A counting sink keeps
totals and a short samples-against-time curve: no metrics file, so 10,000 workers fit.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from paramserver.advise.core.cluster import SimParams
from paramserver.emulation.stragglers import RandomStragglers
from paramserver.policies import SYNC_POLICIES, make_policy
from paramserver.sim.core.comm import LinkSteps
from paramserver.sim.core.engine import Engine, Network, NullSink

CURVE_POINTS = 256  # points kept of the samples-against-time curve
STEADY_FROM = 0.2  # the steady rate is measured past this share of the simulated samples


@dataclass(frozen=True)
class Stretch:
    """A stretch of a simulated run under one policy: a fixed policy's whole run, or one of
    the candidates `auto` put in force, with what its samples to target depend on."""

    policy: str
    apply_mode: str
    samples: float
    staleness: float  # mean over its steps
    update_batch: float  # samples per applied update
    # The calibrated runs it converges as: the policy's own (None), or "" for its apply mode's
    # (auto's ssp and asp, whose pushes auto scales to a round's step, as DynSGD does for the
    # fixed arrival policies and fixed ASP does not: fixed ASP's divergence says little of them).
    calibrated_as: str | None = None

    @property
    def reference(self) -> str:
        """The policy name the convergence model reads for this stretch ("" for the mode's)."""
        return self.policy if self.calibrated_as is None else self.calibrated_as

    def to_json(self) -> dict:
        return {"policy": self.policy, "apply_mode": self.apply_mode, "samples": self.samples,
                "mean_staleness": self.staleness, "update_batch": self.update_batch,
                "calibrated_as": self.reference or f"the {self.apply_mode}-mode runs"}


@dataclass(frozen=True)
class SimOutcome:
    """A policy's simulated run: throughput, waits, staleness and the samples-time curve."""

    policy: str
    options: dict
    apply_mode: str
    workers: int
    samples: int  # simulated
    steps: int
    virtual_s: float  # virtual time at the end
    samples_per_s: float  # steady state (past STEADY_FROM of the samples)
    mean_staleness: float
    update_batch: float  # samples per applied update
    wait_share: float  # mean over workers of wait / (compute + wait + pull + push)
    curve_t: tuple[float, ...]
    curve_samples: tuple[float, ...]
    events: int
    stretches: tuple[Stretch, ...] = ()  # in the order they ran

    def time_to(self, samples: float) -> float:
        """Virtual seconds until `samples` were processed: read off the curve, past its end at
        the steady rate."""
        ts, ss = self.curve_t, self.curve_samples
        if samples <= 0:
            return 0.0
        if samples > ss[-1]:
            return ts[-1] + (samples - ss[-1]) / self.samples_per_s
        i = bisect_left(ss, samples)
        if i == 0:
            return ts[0] * samples / ss[0] if ss[0] else ts[0]
        s0, s1, t0, t1 = ss[i - 1], ss[i], ts[i - 1], ts[i]
        return t0 + (t1 - t0) * (samples - s0) / (s1 - s0) if s1 > s0 else t1

    def to_json(self) -> dict:
        return {"policy": self.policy, "options": dict(self.options),
                "apply_mode": self.apply_mode, "workers": self.workers, "samples": self.samples,
                "steps": self.steps, "virtual_s": self.virtual_s,
                "samples_per_s": self.samples_per_s, "mean_staleness": self.mean_staleness,
                "update_batch": self.update_batch, "wait_share": self.wait_share,
                "events": self.events, "stretches": [x.to_json() for x in self.stretches]}


class CountingSink(NullSink):
    """The engine's sink that counts: per-worker busy and wait seconds, staleness, samples, the
    cumulative samples at (up to) `every` samples apart, and per stretch under one policy (a
    `sync_switch` note starts the next) its samples, steps and staleness."""

    def __init__(self, workers: int, every: float, policy: str = ""):
        # [policy, samples, steps, staleness summed] per stretch, in order
        self.stretches: list[list] = [[policy, 0, 0, 0]]
        self.wait = [0.0] * workers
        self.busy = [0.0] * workers
        self.samples = self.steps = self.staleness = 0
        self.every, self.next_mark = every, every
        self.curve_t: list[float] = []
        self.curve_s: list[float] = []
        self.last_t = 0.0

    def step(self, t, w, step, batch, compute, wait, pull, push, staleness, factor, extra):
        self.wait[w] += wait
        self.busy[w] += compute + wait + pull + push
        self.samples += batch
        self.steps += 1
        self.staleness += staleness
        self.last_t = t
        here = self.stretches[-1]
        here[1] += batch
        here[2] += 1
        here[3] += staleness
        if self.samples >= self.next_mark:
            self.curve_t.append(t)
            self.curve_s.append(float(self.samples))
            self.next_mark = self.samples + self.every

    def event(self, t, kind, data):
        if kind == "sync_switch" and data.get("to"):
            if self.stretches[-1][2] == 0:
                self.stretches[-1][0] = data["to"]
            else:
                self.stretches.append([data["to"], 0, 0, 0])


class EarlyPullLinks(LinkSteps):
    """The engine's modelled links with the live worker's early pull: the train task sends its
    next pull right after its push, so the server answers it the moment the version exists,
    while the clock and the release travel; the reply queues behind no other worker's pull.
    Only pushes queue on the server (its serial handling, where simultaneous workers contend);
    a pull's handling is part of the worker's own time (step_cost adds it).

    `own`: per worker, what a slow link of its own adds to a step (SimParams.comm_extras),
    half on its pull and half on its push, as live. It is link time, not compute: a policy
    that reads each push's compute time (LB-BSP's split, auto's pace book) sees a fixed cost a
    smaller batch does not shorten, as it does live."""

    def __init__(self, network, own: list[float] | None = None):
        super().__init__(network)
        self.half = [x / 2 for x in own] if own and any(own) else None

    def pull(self, t: float, w: int, step: int) -> tuple[float, float]:
        got = t + self.L + (self.half[w] if self.half else 0.0)
        return got, got - (t - self.L)

    def push(self, t: float, w: int, step: int) -> float:
        # The slow link's time after the server's handling, not before: the shared queue is
        # FIFO by call, and a slot taken in the future would hold up pushes that come first.
        return super().push(t, w, step) + (self.half[w] if self.half else 0.0)


def step_cost(p: SimParams, steps_hint: int, seed: int):
    """cost(worker, step, batch) -> seconds: the compute with its noise and stragglers, plus
    the worker's time on the shared link (what a slow link of its own adds is EarlyPullLinks')."""
    mult = p.multipliers()
    n = max(1, steps_hint)
    rng = np.random.default_rng([int(seed), 0xAD71CE])
    if p.sigma > 0:
        draws = rng.lognormal(-p.sigma ** 2 / 2, p.sigma, size=p.workers * n)
    else:
        draws = np.ones(p.workers * n)
    noise = array("d", draws.tobytes())
    transient = RandomStragglers(p.transient_p, p.transient_factor, seed) \
        if p.transient_p > 0 else None
    # the worker's own link time, and its pull's handling, which queues behind no other pull
    c, comm = p.cost_per_sample, p.comm_s + p.server_s
    real = None
    if p.real_per_sample:
        # Emulated device time: the step sleeps up to it, so it lasts max(device-bound
        # compute, real compute); real compute is drawn from the profile's quantiles.
        qs = np.asarray(p.real_per_sample, dtype=float)
        u = rng.random(p.workers * n) * (len(qs) - 1)
        real = array("d", np.interp(u, np.arange(len(qs)), qs).tobytes())

    jitter = None
    if p.comm_sigma > 0 and p.comm_scale > 0:
        # mean-0 noise of the profile's size: it keeps even workers out of step, as live
        draws = p.comm_scale * (rng.lognormal(-p.comm_sigma ** 2 / 2, p.comm_sigma,
                                              size=p.workers * n) - 1.0)
        jitter = array("d", draws.tobytes())

    def cost(w: int, s: int, b: int) -> float:
        x = b * c * mult[w] * noise[w * n + s % n]
        if transient is not None:
            x *= transient.factor(w, s, 0.0)
        if real is not None:
            r = b * real[w * n + s % n]
            if r > x:
                x = r
        if jitter is not None:
            j = comm + jitter[w * n + s % n]
            return x + (j if j > 0 else 0.0)
        return x + comm
    return cost


def simulate_policy(params: SimParams, policy: str, options: dict | None = None, *,
                    samples: int | None = None, steps: int | None = None,
                    seed: int = 0) -> SimOutcome:
    """Run `policy` (with `options`) on the cluster `params` for a sample budget shared by the
    workers (`samples`) or `steps` per worker; see SimOutcome."""
    options = dict(options or {})
    if (samples is None) == (steps is None):
        raise ValueError("give a sample budget or steps per worker (one of them)")
    if (samples is not None and samples < 1) or (steps is not None and steps < 1):
        raise ValueError(f"need samples >= 1 or steps >= 1, got {samples}, {steps}")
    pol = make_policy(policy, params.batch_size, **options)
    total = samples if samples is not None else steps * params.workers * params.batch_size
    hint = steps or max(1, -(-samples // (params.batch_size * params.workers)))
    # One queue per direction stands for every server: its "transfer" is a server's serial
    # handling of one message (the engine divides model_bytes by the servers).
    net = Network(model_bytes=params.server_s * params.servers, bandwidth=1.0,
                  latency=params.coord_latency, servers=params.servers)
    sink = CountingSink(params.workers, max(1.0, total / CURVE_POINTS), policy)
    engine = Engine(pol, params.workers, steps, step_cost(params, hint, seed), net, sink=sink,
                    max_samples=samples)
    engine.comm = EarlyPullLinks(net, params.comm_extras())
    engine.run()
    if not sink.steps:
        raise ValueError(f"{policy}: the simulation ran no step")
    if not sink.curve_s or sink.curve_s[-1] < sink.samples:
        sink.curve_t.append(sink.last_t)
        sink.curve_s.append(float(sink.samples))
    # Every worker's first step pays the warm-up the profile showed: the run starts later.
    start = params.startup_s
    sink.curve_t = [start + t for t in sink.curve_t]
    shares = [wt / b for wt, b in zip(sink.wait, sink.busy) if b > 0]
    updates = engine.rounds if pol.apply_mode == "round" else sink.steps
    update_batch = sink.samples / max(1, updates)
    return SimOutcome(
        policy=policy, options=options, apply_mode=pol.apply_mode, workers=params.workers,
        samples=sink.samples, steps=sink.steps, virtual_s=start + sink.last_t,
        samples_per_s=_steady_rate(sink.curve_t, sink.curve_s),
        mean_staleness=sink.staleness / sink.steps,
        update_batch=update_batch,
        wait_share=sum(shares) / len(shares) if shares else 0.0,
        curve_t=tuple(sink.curve_t), curve_samples=tuple(sink.curve_s), events=engine.events,
        stretches=_stretches(sink.stretches, policy, pol.apply_mode, update_batch,
                             params.workers))


def _stretches(raw: list[list], policy: str, apply_mode: str, update_batch: float,
               workers: int) -> tuple[Stretch, ...]:
    """The sink's stretches, typed. A fixed policy's one stretch is the run itself, its
    update batch counted from the engine's rounds. A candidate in force under auto has the
    servers apply on arrival, a lockstep one scaling each push by its share of the round, so
    it converges as that policy's own apply mode does: a round of every worker's batch is one
    update; an arrival one's pushes are scaled to a round's step, so it converges as the
    arrival-mode runs of the calibration do (most of them DynSGD's), not as fixed ASP."""
    done = [r for r in raw if r[2] > 0]
    if len(done) == 1 and done[0][0] == policy:
        _, samples, steps, stale = done[0]
        return (Stretch(policy, apply_mode, samples, stale / steps, update_batch),)
    out = []
    for policy, samples, steps, stale in done:
        mode = SYNC_POLICIES.get(policy).apply_mode
        per_step = samples / steps
        out.append(Stretch(policy, mode, samples, stale / steps,
                           per_step * workers if mode == "round" else per_step,
                           None if mode == "round" else ""))
    return tuple(out)


def _steady_rate(ts: list[float], ss: list[float]) -> float:
    """Samples/s past the start-up: the slope from STEADY_FROM of the samples to the end."""
    end_t, end_s = ts[-1], ss[-1]
    i = bisect_left(ss, STEADY_FROM * end_s)
    t0, s0 = (ts[i], ss[i]) if i < len(ss) - 1 else (0.0, 0.0)
    if end_t > t0 and end_s > s0:
        return (end_s - s0) / (end_t - t0)
    return end_s / end_t if end_t > 0 else math.inf
