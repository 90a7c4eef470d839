"""The cluster model: how fast each worker computes, its stragglers, its links and its servers,
fitted from a profile (per-worker step records). Pure: no I/O, no clock; numbers in, a frozen,
versioned value out.

What is fitted, from each step record (worker, step, batch, compute_s, pull_s, push_s, bytes,
wait_s; each worker's first step is left out: it holds the start barrier and warm-up):
- cost per sample: a step's compute_s / batch (emulated device time and real compute alike are
  linear in the batch);
- emulated device time (the run's --device-time): the runtime tops a step's real compute up to
  the device time with a sleep, so compute_s = max(device time x straggler factor, real
  compute). Where the profile says its device time and records real_compute_s, the stragglers
  are fitted on the steps the device time bounds, and the real compute per sample is kept as
  its own distribution (REAL_QUANTILES quantiles): the simulated step is the max of the two,
  so a step the device time makes 3x slower never overruns it, while the fast workers'
  overruns (the heavy tail of real compute on shared cores) are neither noise nor stragglers
  multiplied by a slow worker's factor;
- persistent stragglers: a worker whose median cost is PERSISTENT x the fast workers' or more
  is slow by that ratio; at a target scale the *fraction* of slow workers is kept, not ranks;
- transient stragglers: steps far above their own worker's median (TRANSIENT x, or more when
  the noise is wide) are slowdowns that come and go: their rate and median factor;
- noise: the lognormal sigma of the remaining steps around their worker's median;
- links: a step's pull_s and push_s against the bytes moved; the emulated worker link of the
  run's config (rate, latency) when the run had one, else a regression when the bytes vary;
  what is left (messaging, serialisation, the server's apply) is a fixed cost per message;
- a worker's own slow link: a worker whose median pull_s + push_s is PERSISTENT x the other
  workers' and adds SLOW_LINK of a step's compute or more is on a link of its own; the time it
  adds a step is kept with its class, so only that share of the workers pays it (one slow link
  put on every worker made every candidate look as slow as that worker);
- the pace: a worker's steady cycle between records beyond what they record (unrecorded time
  per step), and the warm-up before it (the start);
- the coordinator's message latency: half the mean wait_s of the releases given at the worker's
  own clock (clock in, release out; the profile names them, else the quickest fifth);
- the servers' serial handling per message: their busy seconds over the messages they served.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

VERSION = 1
PERSISTENT = 1.3  # a worker this many times the fast workers' median cost is persistently slow
TRANSIENT = 1.8  # a step this many times its worker's own median is a transient slowdown
FAST_BAND = 1.2  # workers within this factor of the fastest median form the base class
NOISY = 0.3  # a robust lognormal sigma past which the transient threshold follows the noise
REAL_QUANTILES = 33  # quantiles kept of the real compute per sample (0, 1/32, ..., 1)
OVERRUN = 1.001  # a step whose real compute is this close to its compute_s overran the device
SLOW_LINK = 0.05  # a worker's own link must add this share of a step's compute to be one


class ClusterFitError(ValueError):
    """A profile that cannot be fitted (no usable steps, bad numbers) or a bad model file."""


@dataclass(frozen=True)
class StepSample:
    """One worker step as a profile records it (times in seconds)."""

    worker: int
    step: int
    batch: int
    compute_s: float
    pull_s: float | None = None
    push_s: float | None = None
    pull_bytes: float | None = None
    push_bytes: float | None = None
    wait_s: float | None = None
    t: float | None = None  # when the record was written, seconds since the job started
    real_compute_s: float | None = None  # the step's real forward/backward, before the top-up


@dataclass(frozen=True)
class Profile:
    """What a profile source gives the fit: step records and what the run says about itself."""

    steps: tuple[StepSample, ...]
    source: str
    workers: int
    servers: int = 1
    batch_size: int | None = None
    link_rate: float | None = None  # the emulated worker link, bytes/s (None: not shaped)
    link_latency: float = 0.0  # its one-way latency, seconds
    server_busy_s: float | None = None  # the shards' busy seconds summed (their heartbeats)
    model_bytes: float | None = None  # parameters' bytes (the job's keys x item size)
    sync: str | None = None
    round_trip_s: float | None = None  # clock in -> release out of an immediate release
    summary: dict | None = field(default=None, compare=False)  # the run's summary.json, if any
    device_s_per_sample: float | None = None  # the run's emulated device time (None: off)


@dataclass(frozen=True)
class SlowClass:
    """A share of the workers that computes `slowdown` x slower than the base class and whose
    own link adds `comm_extra_s` to each of its steps (1.0 and 0.0: only the other is slow)."""

    fraction: float
    slowdown: float
    comm_extra_s: float = 0.0

    def label(self) -> str:
        parts = [f"{self.slowdown:.3g}x compute"] if self.slowdown != 1.0 else []
        if self.comm_extra_s > 0:
            parts.append(f"its link +{self.comm_extra_s * 1e3:.3g} ms a step")
        return ", ".join(parts)


@dataclass(frozen=True)
class TargetLink:
    """The workers' link at the target scale: rate in bytes/s (None: unlimited), latency in s."""

    rate: float | None
    latency: float = 0.0


@dataclass(frozen=True)
class SimParams:
    """The cluster at a target scale, as the simulator's inputs (see advise.outcome)."""

    workers: int
    servers: int
    batch_size: int
    cost_per_sample: float  # base class, seconds (mean of the noise-free steps)
    sigma: float
    classes: tuple[SlowClass, ...]  # persistent stragglers (fractions of the workers)
    transient_p: float
    transient_factor: float
    comm_s: float  # per step: pull + push time on the worker's own link, beyond the sim's
    coord_latency: float  # one-way, per coordinator message
    server_s: float  # per message, serial on each server (queues across workers)
    startup_s: float = 0.0  # before the first step ends beyond a usual step (warm-up)
    # quantiles of the real compute per sample; a step computes max(the device-bound compute
    # above, batch x a draw from these); empty: no emulated device time, compute is the above
    real_per_sample: tuple[float, ...] = ()
    # a step's communication varies as the profile's pull_s + push_s did: that much (median,
    # seconds) times a mean-1 lognormal of comm_sigma, less its median, is added to the step
    comm_sigma: float = 0.0
    comm_scale: float = 0.0

    def rank_classes(self) -> list[SlowClass | None]:
        """Per rank its class (None: the base): the slow classes take the last ranks."""
        base = max(0.0, 1.0 - sum(c.fraction for c in self.classes))
        out: list[SlowClass | None] = [None] * round(base * self.workers)
        cum = base
        for c in self.classes:
            cum += c.fraction
            out += [c] * (round(cum * self.workers) - len(out))
        fill = self.classes[-1] if self.classes else None
        return (out + [fill] * (self.workers - len(out)))[:self.workers]

    def multipliers(self) -> list[float]:
        """Per rank its persistent slowdown."""
        return [1.0 if c is None else c.slowdown for c in self.rank_classes()]

    def comm_extras(self) -> list[float]:
        """Per rank the seconds its own link adds to a step beyond the base workers' link."""
        return [0.0 if c is None else c.comm_extra_s for c in self.rank_classes()]

    def compute_spec(self) -> str:
        """The `--compute` spec of `paramserver simulate` for the compute part alone (a class
        slow only by its link computes as the base does)."""
        parts = []
        if any(c.slowdown != 1.0 for c in self.classes):
            shares: dict[float, float] = {1.0: max(0.0, 1.0 - sum(c.fraction
                                                                for c in self.classes))}
            for c in self.classes:
                shares[c.slowdown] = shares.get(c.slowdown, 0.0) + c.fraction
            parts.append("classes:" + ",".join(f"{f:.6g}={m:.6g}" for m, f in shares.items()
                                               if f > 0))
        parts.append(f"lognormal:{self.cost_per_sample * 1e3:.6g}ms:{self.sigma:.4g}")
        return "+".join(parts)

    def straggler_spec(self) -> str:
        if self.transient_p <= 0:
            return "none"
        return f"random:{self.transient_p:.6g}:{self.transient_factor:.6g}"


@dataclass(frozen=True)
class ClusterModel:
    """A fitted cluster (see the module doc); `at(scale)` gives the simulator's inputs."""

    version: int
    source: str
    profile_workers: int
    profile_servers: int
    batch_size: int
    cost_per_sample: float  # the base (fast) class: seconds per sample, mean
    sigma: float  # lognormal sigma of a step around its worker's median
    classes: tuple[SlowClass, ...]  # persistent stragglers
    transient_p: float
    transient_factor: float
    model_bytes: float  # bytes a pull or a push moves
    link_rate: float | None  # the profile's worker link, bytes/s (None: unshaped/unknown)
    link_latency: float  # its one-way latency, seconds
    pull_fixed_s: float  # a pull's time beyond its link's transfer and latency
    push_fixed_s: float  # likewise a push (includes the server's apply)
    coord_latency: float  # coordinator messages, one-way (without the link's latency)
    server_s: float  # the servers' serial handling per message (one server's view)
    startup_s: float  # the first steps' extra time (process warm-up, first pulls)
    unrecorded_s: float  # per step, beyond its records' compute, wait, pull and push
    steps_used: int
    notes: tuple[str, ...] = ()
    real_per_sample: tuple[float, ...] = ()  # see SimParams
    comm_sigma: float = 0.0  # see SimParams
    comm_scale: float = 0.0

    # ---- the target scale -----------------------------------------------------------------------
    def link_comm(self, link: TargetLink | None = None) -> float:
        """A step's pull + push on the worker's own link (no other worker shares it), and the
        step's unrecorded time."""
        link = link or TargetLink(self.link_rate, self.link_latency)
        tx = 0.0 if not link.rate else self.model_bytes / link.rate
        # pull: request up (L), reply down (L + tx); push: up (L + tx), ack down (L)
        return (self.pull_fixed_s + self.push_fixed_s + self.unrecorded_s + 2 * tx
                + 4 * link.latency)

    def at(self, workers: int, servers: int | None = None, link: TargetLink | None = None,
           batch_size: int | None = None) -> SimParams:
        """The cluster at `workers` x `servers` with the workers' `link` (default: the
        profile's); slow classes and the transient rate are kept as fractions. `link` is the
        link the workers share: a class on a slower link of its own keeps what it adds."""
        if workers < 1 or (servers is not None and servers < 1):
            raise ValueError(f"need workers >= 1 and servers >= 1, got {workers}, {servers}")
        servers = servers or self.profile_servers
        latency = self.link_latency if link is None else link.latency
        per_server = self.server_s * self.profile_servers / servers
        # The simulator's step: wait 2L (clock, release), pull and push 2L + a server's
        # handling each, then the worker's own link time `comm` on top of its compute.
        L = self.coord_latency + latency
        comm = self.link_comm(link) - 4 * L - 2 * per_server
        if comm < 0:  # messages faster than the coordinator's: keep the step's total
            comm, L = 0.0, max(0.0, (2 * L + self.link_comm(link) - 2 * per_server) / 6)
        return SimParams(workers=workers, servers=servers,
                         batch_size=batch_size or self.batch_size,
                         cost_per_sample=self.cost_per_sample, sigma=self.sigma,
                         classes=self.classes, transient_p=self.transient_p,
                         transient_factor=self.transient_factor, comm_s=comm,
                         coord_latency=L, server_s=per_server, startup_s=self.startup_s,
                         real_per_sample=self.real_per_sample, comm_sigma=self.comm_sigma,
                         comm_scale=self.comm_scale)

    def to_sim(self, workers: int, servers: int | None = None,
               link: TargetLink | None = None) -> dict:
        """SimConfig fields for `paramserver simulate`. Its grammar multiplies the straggler
        factor into the whole step, so the link's time goes in as latency (its coordinator
        messages then pay it too), and it has no link of a worker's own (a slow-link class's
        extra is left out): advise.outcome drives the engine with the exact split."""
        p = self.at(workers, servers, link)
        latency = p.coord_latency + p.comm_s / 4
        return {"workers": p.workers, "servers": p.servers, "batch_size": p.batch_size,
                "compute": p.compute_spec(), "straggler": p.straggler_spec(),
                "bandwidth": "unlimited" if p.server_s <= 0 else
                f"{8 * self.model_bytes / (p.server_s * p.servers):.6g}bit/s",
                "latency": f"{latency * 1e6:.6g}us", "param_bytes": f"{self.model_bytes:.0f}B"}

    # ---- JSON -----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        d = asdict(self)
        d["classes"] = [asdict(c) for c in self.classes]
        d["notes"] = list(self.notes)
        d["real_per_sample"] = list(self.real_per_sample)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "ClusterModel":
        if not isinstance(d, dict):
            raise ClusterFitError(f"a cluster model is a JSON object, got {type(d).__name__}")
        if d.get("version") != VERSION:
            raise ClusterFitError(f"cluster model version {d.get('version')!r} is not {VERSION}; "
                                  f"fit it again from its profile")
        try:
            return cls(**{**d, "classes": tuple(SlowClass(**c) for c in d["classes"]),
                          "notes": tuple(d.get("notes", ())),
                          "real_per_sample": tuple(float(x) for x in
                                                   d.get("real_per_sample", ()))})
        except (KeyError, TypeError) as exc:
            raise ClusterFitError(f"bad cluster model: {exc}") from None


# ---- fitting ------------------------------------------------------------------------------------
def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        raise ClusterFitError("nothing to take a median of")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(q * (len(s) - 1) + 0.5)))]


def _usable(profile: Profile) -> list[StepSample]:
    bad = [s for s in profile.steps if not (s.batch >= 1 and math.isfinite(s.compute_s)
                                            and s.compute_s >= 0)]
    if bad:
        raise ClusterFitError(f"{profile.source}: step record with a bad batch or compute_s: "
                              f"{bad[0]}")
    first = {}
    for s in profile.steps:
        first[s.worker] = min(first.get(s.worker, s.step), s.step)
    steps = [s for s in profile.steps if s.step != first[s.worker] and s.compute_s > 0]
    if len(steps) < 3:
        raise ClusterFitError(f"{profile.source}: {len(steps)} usable step records (each "
                              f"worker's first is left out); profile longer")
    return steps


def _stragglers(steps: list[StepSample]) -> tuple[float, float, dict[int, float], float, float,
                                                  dict[int, float]]:
    """(cost per sample, sigma, each worker's slowdown against the base, transient p,
    transient factor, worker medians)."""
    per: dict[int, list[float]] = {}
    for s in steps:
        per.setdefault(s.worker, []).append(s.compute_s / s.batch)
    med = {w: _median(v) for w, v in per.items()}
    logs = [math.log(c / med[w]) for w, v in per.items() for c in v]
    robust_sigma = 1.4826 * _median([abs(x) for x in logs])
    # Steps TRANSIENT x their worker's median are slowdowns that come and go; only a noise so
    # wide that its own tail passes that often (sigma > NOISY) raises the bar. Real compute
    # overrunning emulated device time is a heavy tail, not a straggler: it stays noise.
    cut = TRANSIENT if robust_sigma <= NOISY else max(TRANSIENT, math.exp(3 * robust_sigma))
    calm = [x for x in logs if x < math.log(cut)]
    slow = [math.exp(x) for x in logs if x >= math.log(cut)]
    mu = sum(calm) / len(calm)
    sigma = math.sqrt(sum((x - mu) ** 2 for x in calm) / max(1, len(calm) - 1))
    p = len(slow) / len(logs)
    factor = _median(slow) if slow else 1.0
    # The base: workers near the fastest; a worker PERSISTENT x that or slower is its own class.
    fastest = min(med.values())
    base = _median([m for m in med.values() if m <= FAST_BAND * fastest])
    ratios = {w: m / base for w, m in med.items()}
    # The mean of the base class's calm steps, so mean-1 noise keeps the mean cost.
    base_costs = [c for w, v in per.items() if ratios[w] < PERSISTENT for c in v
                  if c / med[w] < cut]
    cost = sum(base_costs) / len(base_costs) * base / _median(
        [med[w] for w in per if ratios[w] < PERSISTENT])
    return cost, sigma, ratios, p, factor, med


def _slow_links(steps: list[StepSample], step_s: float) -> dict[int, float]:
    """Per worker the seconds its own link adds to a step: its median pull_s + push_s less the
    base workers' (those within PERSISTENT x the quickest), where that is PERSISTENT x the
    base's and SLOW_LINK of a step's compute (`step_s`) or more; else 0. A worker's own link
    shows in its own steps whatever the run's config said of it."""
    per: dict[int, list[float]] = {}
    for s in steps:
        if s.pull_s is not None and s.push_s is not None:
            per.setdefault(s.worker, []).append(s.pull_s + s.push_s)
    if len(per) < 2:
        return {}
    med = {w: _median(v) for w, v in per.items()}
    quickest = min(med.values())
    base = _median([m for m in med.values() if m <= PERSISTENT * quickest])
    return {w: m - base for w, m in med.items()
            if m >= PERSISTENT * base and m - base >= SLOW_LINK * step_s}


def _classes(ratios: dict[int, float], extras: dict[int, float]) -> list[SlowClass]:
    """The workers grouped by their slowdown (PERSISTENT x or more, else 1) and their own
    link's extra time, to two significant figures; the base group is left out."""
    groups: dict[tuple[float, float], int] = {}
    for w, r in ratios.items():
        key = (float(f"{r:.2g}") if r >= PERSISTENT else 1.0,
               float(f"{extras[w]:.2g}") if extras.get(w, 0.0) > 0 else 0.0)
        if key != (1.0, 0.0):
            groups[key] = groups.get(key, 0) + 1
    return [SlowClass(n / len(ratios), k, e) for (k, e), n in sorted(groups.items())]


def _links(profile: Profile, steps: list[StepSample]) -> tuple[float, float | None, float,
                                                                 float, float, list[str]]:
    """(model bytes, link rate, link latency, pull fixed, push fixed, notes), of the `steps`
    of the workers on the shared link."""
    notes = []
    with_comm = [s for s in steps if s.pull_s is not None and s.push_s is not None]
    sizes = [s.pull_bytes or s.push_bytes for s in with_comm if (s.pull_bytes or s.push_bytes)]
    nbytes = profile.model_bytes or (_median(sizes) if sizes else 0.0)
    if not with_comm:
        notes.append("no pull_s/push_s in the profile: communication taken as free")
        return nbytes, profile.link_rate, profile.link_latency, 0.0, 0.0, notes
    rate, latency = profile.link_rate, profile.link_latency
    if rate is None:
        rate = _regress_rate(with_comm)
        if rate is not None:
            notes.append(f"link rate {rate * 8 / 1e6:.4g} Mbit/s from pull_s/push_s vs bytes")
    else:
        notes.append(f"link {rate * 8 / 1e6:.4g} Mbit/s, {latency * 1e3:.3g} ms from the "
                     f"run's emulated link")

    def fixed(times: list[tuple[float, float]]) -> float:
        # The mean, not the median: a step's total is what paces the run.
        tx = [t - (b / rate if rate else 0.0) - 2 * latency for t, b in times]
        return max(0.0, sum(tx) / len(tx))

    pull = fixed([(s.pull_s, s.pull_bytes or nbytes) for s in with_comm])
    push = fixed([(s.push_s, s.push_bytes or nbytes) for s in with_comm])
    return nbytes, rate, latency, pull, push, notes


def _regress_rate(steps: list[StepSample]) -> float | None:
    """Bytes/s from least squares of time on bytes (pulls and pushes together); None when the
    bytes do not vary enough to tell a rate from a fixed cost, or the slope is not positive."""
    pts = [(s.pull_bytes, s.pull_s) for s in steps if s.pull_bytes] + \
          [(s.push_bytes, s.push_s) for s in steps if s.push_bytes]
    if len(pts) < 4:
        return None
    xs = [b for b, _ in pts]
    mx = sum(xs) / len(xs)
    var = sum((x - mx) ** 2 for x in xs) / len(xs)
    if mx <= 0 or math.sqrt(var) / mx < 0.1:
        return None
    my = sum(t for _, t in pts) / len(pts)
    slope = sum((b - mx) * (t - my) for b, t in pts) / len(pts) / var
    return 1.0 / slope if slope > 0 else None


def _pace(all_steps: tuple[StepSample, ...]) -> tuple[float, float]:
    """(startup, unrecorded time per step), medians over workers, from the records' t.

    A worker's steady cycle is the time between its records over the second half of its run;
    what its records' parts (compute, wait, pull, push) leave of it is unrecorded time (sleep
    overshoot, bookkeeping). Extending that cycle back from its last record to step 0 gives
    when it started: the warm-up, which spans a few steps, is what is left before."""
    per: dict[int, list[StepSample]] = {}
    for s in all_steps:
        if s.t is not None:
            per.setdefault(s.worker, []).append(s)
    starts, gaps = [], []
    for rows in per.values():
        rows.sort(key=lambda s: s.step)
        half = rows[len(rows) // 2:]
        if len(half) < 3:
            continue
        cycle = (half[-1].t - half[0].t) / (len(half) - 1)
        parts = [s.compute_s + (s.pull_s or 0) + (s.push_s or 0) + (s.wait_s or 0)
                 for s in half[1:]]
        gaps.append(cycle - sum(parts) / len(parts))
        starts.append(half[-1].t - len(rows) * cycle)
    if not starts:
        return 0.0, 0.0
    return max(0.0, _median(starts)), max(0.0, _median(gaps))


def _device_bound(profile: Profile, steps: list[StepSample]
                  ) -> tuple[list[StepSample], tuple[float, ...], list[str]]:
    """(the steps the device time bounds, quantiles of real compute per sample, notes); all the
    steps and no quantiles when the profile has no device time or no real compute."""
    if not profile.device_s_per_sample:
        return steps, (), []
    real = [s for s in steps if s.real_compute_s is not None and s.real_compute_s >= 0]
    if len(real) < len(steps) or not real:
        return steps, (), []
    bound = [s for s in steps if s.real_compute_s * OVERRUN < s.compute_s]
    if len(bound) < 3:
        return steps, (), []
    per = sorted(s.real_compute_s / s.batch for s in real)
    qs = tuple(_quantile(per, i / (REAL_QUANTILES - 1)) for i in range(REAL_QUANTILES))
    over = 1 - len(bound) / len(steps)
    return bound, qs, [f"real compute {_median(per) * 1e3:.3g} ms/sample (median) under a "
                       f"device time of {profile.device_s_per_sample * 1e3:.3g} ms/sample: "
                       f"{over:.1%} of steps overran it"]


def fit(profile: Profile) -> ClusterModel:
    """The cluster model of `profile` (see the module doc)."""
    steps = _usable(profile)
    bound, real_q, real_notes = _device_bound(profile, steps)
    cost, sigma, ratios, p, factor, med = _stragglers(bound)
    extras = _slow_links(steps, cost * _median([s.batch for s in steps]))
    classes = _classes(ratios, extras)
    shared = [s for s in steps if s.worker not in extras]
    nbytes, rate, latency, pull, push, notes = _links(profile, shared)
    waits = sorted(s.wait_s for s in steps if s.wait_s is not None and s.wait_s >= 0)
    # Without the policy's decisions, the quickest fifth of the waits stands for the
    # releases given at once (as sim.replay.calibrate falls back to).
    trip = profile.round_trip_s
    if trip is None and waits:
        quick = waits[:max(1, len(waits) // 5)]
        trip = sum(quick) / len(quick)
    coord = max(0.0, (trip or 0.0) / 2 - latency)
    messages = 2 * len(profile.steps)
    server_s = (profile.server_busy_s / messages if profile.server_busy_s and messages
                else 0.0)
    batches = [s.batch for s in steps]
    startup, unrecorded = _pace(profile.steps)
    notes += real_notes
    comm_scale, comm_sigma = _comm_jitter(shared)
    if p > 0:
        notes.append(f"transient stragglers: {p:.1%} of steps, {factor:.3g}x")
    for c in classes:
        notes.append(f"persistent stragglers: {c.fraction:.1%} of workers, {c.label()}")
    return ClusterModel(
        version=VERSION, source=profile.source, profile_workers=max(profile.workers, len(med)),
        profile_servers=profile.servers, batch_size=profile.batch_size or round(_median(batches)),
        cost_per_sample=cost, sigma=sigma, classes=tuple(classes), transient_p=p,
        transient_factor=factor, model_bytes=nbytes, link_rate=rate, link_latency=latency,
        pull_fixed_s=pull, push_fixed_s=push, coord_latency=coord, server_s=server_s,
        startup_s=startup, unrecorded_s=unrecorded, steps_used=len(steps), notes=tuple(notes),
        real_per_sample=real_q, comm_sigma=comm_sigma, comm_scale=comm_scale)


def _comm_jitter(steps: list[StepSample]) -> tuple[float, float]:
    """(median, robust lognormal sigma around it) of a step's pull_s + push_s.

    Communication jitter is what keeps even workers out of step live: without it four
    workers of one speed push in lockstep in the simulator and each push sees half the others
    (mean staleness 1.5 under ASP) where live each sees nearly all (2.8-2.9), and staleness
    costs samples to target."""
    xs = [math.log(s.pull_s + s.push_s) for s in steps
          if s.pull_s is not None and s.push_s is not None and s.pull_s + s.push_s > 0]
    if len(xs) < 3:
        return 0.0, 0.0
    m = _median(xs)
    return math.exp(m), 1.4826 * _median([abs(x - m) for x in xs])
