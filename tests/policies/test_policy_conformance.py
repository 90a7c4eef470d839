"""Conformance of every registered sync policy, driven by scripted and randomized event sequences.

Every policy in SYNC_POLICIES runs through the deterministic driver (virtual time, workers
joining and dying at random, `not_before` honoured) and must never deadlock nor release a
worker for a step it is not at. Each model's own promise is then checked by a monitor that
watches the run: BSP-like rounds, SSP's bound, R2SP's rotation and spacing, LB-BSP's batch
split, ElasticBSP's barriers at the ZipLine choice (against an exhaustive search).
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from paramserver.core.keyspace import KeyRange
from paramserver.optim import SGD
from paramserver.core.options import option_help
from paramserver.policies import (
    ApplyRound, Joined, Left, Note, PolicyError, Pushed, Release, SYNC_POLICIES, make_policy,
    policy_options,
)
from paramserver.policies.batch_split import split_batch
from paramserver.server.store import ShardStore
from policy_driver import Driver, VirtualWorker

BATCH = 8

# Extra configurations per policy; a registered policy missing here runs with its defaults.
CONFIGS: dict[str, list[dict]] = {
    "ssp": [{}, {"staleness": 0}, {"staleness": 1}],
    "ebsp": [{"lookahead": 4}, {"predictor": "median"},
             {"predictor": "ema", "variant": "zipline-opt-bs", "lookahead": 6}],
    "r2sp": [{"warmup": 2}, {"warmup": 0, "heterogeneous": True, "max_batch": 20},
             {"warmup": 3, "strict": True}],
    "lbbsp": [{}, {"predictor": "median", "min_batch": 4, "max_batch": 12},
              {"predictor": "last", "min_batch": 9}],
    "dssp": [{}, {"staleness": 0, "r_max": 2}, {"staleness": 1, "r_max": 0}],
    # Decisions at every push, no hysteresis: the churn meets switches and drains all along.
    "auto": [{}, {"interval": 1e-3, "margin": 0.0, "horizon": 1e3},
             {"candidates": "asp,ssp,lbbsp,bsp", "interval": 1e-3, "margin": 0.0,
              "horizon": 1e3, "window": 2}],
}


def all_configs():
    return [(name, kw) for name in SYNC_POLICIES.names() for kw in CONFIGS.get(name, [{}])]


# ---- scripted workers ---------------------------------------------------------------------------

def jittered(per_sample: float, jitter: float, seed: int):
    """Step cost = per_sample * batch * (1 +- jitter/2), fixed per (seed, step): replayable."""
    def cost(step, batch, now):
        u = random.Random(seed * 1_000_003 + step).uniform(-0.5, 0.5) if jitter else 0.0
        return per_sample * batch * (1 + jitter * u)
    return cost


@st.composite
def worker_scripts(draw, max_workers=5, churn=True):
    workers = []
    for w in range(draw(st.integers(1, max_workers))):
        join = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.05))) if churn else 0.0
        die = draw(st.one_of(st.none(), st.floats(0.0, 0.12))) if churn else None
        cost = jittered(draw(st.floats(1e-4, 1e-3)), draw(st.sampled_from([0.0, 0.3, 1.0])),
                        draw(st.integers(0, 2**16)))
        workers.append(VirtualWorker(w, join, draw(st.integers(1, 20)), die, cost))
        if churn and die is not None and draw(st.booleans()):  # the id comes back, as ranks do
            rejoin = max(join, die) + draw(st.floats(0.0, 0.02))
            workers.append(VirtualWorker(w, rejoin, draw(st.integers(1, 10)), None, cost))
    return workers


def max_live(trace) -> int:
    """Most workers live at once during the run."""
    events = sorted([(t, 1) for t, _ in trace.joined] + [(t, -1) for t, _, _ in trace.left],
                    key=lambda e: (e[0], -e[1]))
    return max(itertools.accumulate(d for _, d in events), default=0)


# ---- monitors: one model's promise each ---------------------------------------------------------

class Monitor:
    """Watches one run through the driver's hooks; `finish` checks what is left at the end."""

    def __init__(self, kw: dict):
        self.kw = kw
        self.driver: Driver | None = None

    def on_decision(self, driver, d) -> None: ...

    def on_push(self, worker, rec) -> None: ...

    def finish(self, driver, trace) -> None: ...


class RoundMonitor(Monitor):
    """BSP-like: rounds 0, 1, 2... in order; round k holds exactly the live pushes of step k."""

    def __init__(self, kw):
        super().__init__(kw)
        self.pushes_seen: dict[int, int] = {}

    def on_decision(self, driver, d):
        if isinstance(d, ApplyRound):
            assert d.step == len(driver.trace.rounds), "rounds must be applied in order"
            self.pushes_seen[d.step] = len(driver.trace.pushes)
            pushers = {p.worker for p in driver.trace.pushes if p.step == d.step}
            assert set(d.contributors) <= pushers
            assert pushers - set(d.contributors) <= {w for _, w, _ in driver.trace.left}

    def finish(self, driver, trace):
        for p in trace.pushes:
            # Sequential rounds: a step-k gradient is computed on the result of rounds 0..k-1.
            assert p.base_version == p.step, p
        for k, seen in self.pushes_seen.items():
            assert all(p.step != k for p in trace.pushes[seen:]), f"push for closed round {k}"


class SSPMonitor(Monitor):
    """At a release for step c every live worker has completed step c - s - 1 (DSSP: s + r_max)."""

    dynamic = False

    def on_decision(self, driver, d):
        if isinstance(d, Release):
            s = self.kw.get("staleness", 3) + self.kw.get("r_max", 4 if self.dynamic else 0)
            for j in driver.live_workers():
                pos = driver.position(j)
                assert pos is None or pos >= d.step - s, (
                    f"worker {d.worker} released for step {d.step} while {j} has done {pos}")


class DSSPMonitor(SSPMonitor):
    dynamic = True


class R2SPMonitor(Monitor):
    """Rotation: between two permissions of a worker each other gets at most one; spacing."""

    def __init__(self, kw):
        super().__init__(kw)
        self.rotating_since: float | None = None
        self.T: float | None = None
        self.last_push: dict[tuple, float] = {}
        self.last_permit: float | None = None
        self.since: dict[tuple, set] = {}
        self.gaps: list[tuple[float, float]] = []
        self.changes = 0  # joins and leaves seen: an interval spanning one is not measured

    def on_push(self, worker, rec):
        changes = len(self.driver.trace.joined) + len(self.driver.trace.left)
        if changes != self.changes:
            self.changes, self.last_push = changes, {}
        key = (worker, self.driver.incarnation(worker))
        if key in self.last_push:
            a, interval = self.kw.get("ema", 0.2), rec.time - self.last_push[key]
            self.T = interval if self.T is None else a * interval + (1 - a) * self.T
        self.last_push[key] = rec.time

    def on_decision(self, driver, d):
        if isinstance(d, Note) and d.kind == "r2sp_rotation":
            self.rotating_since = driver.now
        if not isinstance(d, Release) or self.rotating_since is None:
            return
        at = driver.now if d.not_before is None else max(driver.now, d.not_before)
        if self.last_permit is not None:
            gap = self.kw.get("gap_ratio", 0.8) * (self.T or 0.0) / len(driver.live_workers())
            assert at >= self.last_permit + gap - 1e-12, (at, self.last_permit, gap)
            self.gaps.append((at - self.last_permit, gap))
        self.last_permit = at
        me = (d.worker, driver.incarnation(d.worker))
        live = {(w, driver.incarnation(w)) for w in driver.live_workers()}
        self.since = {k: v for k, v in self.since.items() if k in live}
        for other, seen in self.since.items():
            assert other == me or me not in seen, f"{me} got two turns within one of {other}"
            seen.add(me)
        self.since[me] = set()

    def finish(self, driver, trace):
        if self.rotating_since is None:
            return
        n = max_live(trace)
        bound = n - 1 if self.kw.get("strict") else 2 * (n - 1)
        for p in trace.pushes:
            if p.time - p.compute_time >= self.rotating_since:
                assert p.staleness <= bound, (p, n)


class LBBSPMonitor(RoundMonitor):
    """Every allocation sums to the global batch, within bounds, larger for faster workers."""

    def __init__(self, kw):
        super().__init__(kw)
        self.released: dict[tuple, int] = {}

    def on_decision(self, driver, d):
        super().on_decision(driver, d)
        if isinstance(d, Release):
            self.released[(d.worker, d.step)] = d.batch_size
        if isinstance(d, Note) and d.kind == "lbbsp_batches":
            check_allocation(d.data, self.kw)
            for w, b in zip(d.data["workers"], d.data["batch"]):
                assert self.released[(w, d.data["round"])] == b


def check_allocation(data: dict, kw: dict) -> None:
    sizes, speeds, total = data["batch"], data["speed"], data["global_batch"]
    lo = kw.get("min_batch", 1)
    hi = kw.get("max_batch") or max(total, lo)
    n = len(sizes)
    assert all(lo <= b <= hi for b in sizes), (sizes, lo, hi)
    if n * lo <= total <= n * hi:
        assert sum(sizes) == total, data
    for a, b in itertools.permutations(range(n), 2):
        if speeds[a] > speeds[b]:
            assert sizes[a] >= sizes[b], data


class EBSPMonitor(Monitor):
    """Each planned worker is held exactly after its sync step and released at the barrier."""

    def __init__(self, kw):
        super().__init__(kw)
        self.plans: list[tuple[float, dict, int]] = []  # (time, data, pushes seen by then)
        self.barriers: list[tuple[float, dict]] = []
        self.who: dict[int, set] = {}  # id(note data) -> (worker, incarnation) it names

    def on_decision(self, driver, d):
        if isinstance(d, Note) and d.kind in ("ebsp_plan", "ebsp_barrier"):
            self.who[id(d.data)] = {(w, driver.incarnation(w)) for w in d.data["workers"]}
        if isinstance(d, Note) and d.kind == "ebsp_plan":
            self.plans.append((driver.now, d.data, len(driver.trace.pushes)))
        elif isinstance(d, Note) and d.kind == "ebsp_barrier":
            self.barriers.append((driver.now, d.data))

    def next_barrier(self, t: float):
        return next((b for b in self.barriers if b[0] >= t), None)

    def finish(self, driver, trace):
        for t, plan, _ in self.plans:
            barrier = self.next_barrier(t)
            if barrier is None:
                continue  # the run ended (or emptied) before this barrier
            tb, note = barrier
            planned, held = self.who[id(plan)], self.who[id(note)]
            for w, sync in zip(plan["workers"], plan["sync_step"]):
                if any(k in held for k in planned if k[0] == w):
                    assert any(r.worker == w and r.decided == tb and r.step == sync + 1
                               for r in trace.releases), (w, plan, note)


MONITORS = {"bsp": RoundMonitor, "ssp": SSPMonitor, "dssp": DSSPMonitor, "r2sp": R2SPMonitor,
            "lbbsp": LBBSPMonitor, "ebsp": EBSPMonitor}


def run_checked(name: str, kw: dict, workers, **driver_kw):
    """Run one policy through the driver with its monitor; return (driver, trace, monitor)."""
    policy = make_policy(name, BATCH, **kw)
    mon = MONITORS.get(name, Monitor)(kw)
    drv = Driver(policy, workers, on_decision=mon.on_decision, on_push=mon.on_push,
                 **driver_kw)
    mon.driver = drv
    trace = drv.run()  # raises DriverError on deadlock or a release for a wrong step
    for s in drv.states:
        assert s.status == "gone"
        assert s.left_reason == "dead" or s.steps_done == s.spec.steps, (s.spec, s.steps_done)
    mon.finish(drv, trace)
    return drv, trace, mon


# ---- every policy -------------------------------------------------------------------------------

@pytest.mark.parametrize("name,kw", all_configs(), ids=lambda x: str(x))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=worker_scripts())
def test_every_policy_conforms_under_random_churn(name, kw, workers):
    run_checked(name, kw, workers)


@pytest.mark.parametrize("name,kw", all_configs(), ids=lambda x: str(x))
def test_scripted_churn_no_deadlock(name, kw):
    """Deaths at awkward moments: the slowest mid-step, everyone but one, a whole restart."""
    slow, fast = jittered(2e-3, 0.0, 0), jittered(2e-4, 0.5, 1)
    workers = [VirtualWorker(0, 0.0, 30, None, fast),
               VirtualWorker(1, 0.0, 30, 0.031, slow),  # dies while the others wait for it
               VirtualWorker(2, 0.0, 30, 0.05, fast),
               VirtualWorker(3, 0.02, 25, None, slow),  # joins mid-run
               VirtualWorker(1, 0.06, 10, None, fast),  # its id comes back
               VirtualWorker(4, 0.0, 1, None, fast)]  # leaves after one step
    run_checked(name, kw, workers)
    # Everybody dies; then a fresh worker must still be served.
    lone = [VirtualWorker(0, 0.0, 50, 0.01, fast), VirtualWorker(1, 0.0, 50, 0.01, slow),
            VirtualWorker(2, 0.03, 5, None, fast)]
    run_checked(name, kw, lone)


@pytest.mark.parametrize("name", SYNC_POLICIES.names())
def test_every_policy_refuses_pushes_for_steps_it_did_not_release(name):
    p = make_policy(name, BATCH)
    first = p.handle(Joined(0, 0.0))
    assert [d.step for d in first if isinstance(d, Release)] == [0]
    with pytest.raises(PolicyError):
        p.handle(Pushed(0, 5, 0.1, BATCH, 0.01))
    with pytest.raises(PolicyError):
        p.handle(Pushed(9, 0, 0.1, BATCH, 0.01))
    assert p.handle(Left(7, 0.2)) == []  # an unknown worker leaving is a no-op


@pytest.mark.parametrize("name", SYNC_POLICIES.names())
def test_options_are_listed_with_defaults_and_bad_ones_refused(name):
    cls = SYNC_POLICIES.get(name)
    assert cls.__doc__ and policy_options(name) == option_help(cls)
    defaults = {k: v for k, (v, _) in policy_options(name).items()}
    make_policy(name, BATCH, **defaults)  # the listed defaults are accepted as they are
    with pytest.raises(ValueError):
        make_policy(name, BATCH, no_such_option=1)


@pytest.mark.parametrize("name,bad", [
    ("ssp", {"staleness": -1}), ("ebsp", {"lookahead": 0}), ("ebsp", {"predictor": "x"}),
    ("ebsp", {"variant": "x"}), ("r2sp", {"gap_ratio": -0.1}), ("r2sp", {"ema": 0}),
    ("lbbsp", {"predictor": "x"}), ("dssp", {"r_max": -1}),
    ("lbbsp", {"max_batch": 4, "min_batch": 5}), ("auto", {"candidates": "bsp,fastest"}),
    ("auto", {"candidates": "bsp,bsp"}), ("auto", {"interval": 0}), ("auto", {"window": 0}),
])
def test_bad_option_values_fail_clearly(name, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_policy(name, BATCH, **bad)


# ---- BSP and LB-BSP: sequential rounds, numerically ---------------------------------------------

@pytest.mark.parametrize("name,kw", [("bsp", {}), ("lbbsp", {"predictor": "last"})])
@settings(max_examples=15, deadline=None)
@given(workers=worker_scripts(max_workers=4, churn=False))
def test_round_policies_equal_sequential_rounds(name, kw, workers):
    """Servers fed through the policy end where a sequential loop over rounds ends."""
    dim, lr = 3, 0.1
    targets = {w.worker: torch.arange(dim, dtype=torch.float64) * (w.worker + 1) for w in workers}
    store = ShardStore(KeyRange(0, dim), "float64", SGD(lr), "round")
    reads: dict[int, torch.Tensor] = {}

    def on_push(w, rec):
        grad = reads[w] - targets[w]
        store.push(str(w), slice(None), grad, rec.step, rec.batch_size, rec.base_version, 1.0)

    policy = make_policy(name, BATCH, **kw)
    drv = Driver(policy, workers, on_push=on_push, on_apply=lambda d: store.apply_round(d.step),
                 on_pull=lambda w, rel: reads.__setitem__(w, store.values.clone()))
    trace = drv.run()
    x = torch.zeros(dim, dtype=torch.float64)
    for _, rnd in trace.rounds:
        batch = {p.worker: p.batch_size for p in trace.pushes if p.step == rnd.step}
        total = sum(batch[w] for w in rnd.contributors)
        grad = sum(batch[w] * (x - targets[w]) for w in rnd.contributors) / total
        x = x - lr * grad
    torch.testing.assert_close(store.values, x)


# ---- SSP ----------------------------------------------------------------------------------------

def test_ssp_blocked_workers_wait_for_the_slowest_and_leaving_unblocks():
    p = make_policy("ssp", BATCH, staleness=1)
    for w in (0, 1):
        p.handle(Joined(w, 0.0))
    assert p.handle(Pushed(0, 0, 0.1, BATCH, 0.1)) == [Release(0, 1, BATCH)]
    assert p.handle(Pushed(0, 1, 0.2, BATCH, 0.1)) == []  # 2 - 0 > 1: wait for worker 1
    assert p.handle(Pushed(1, 0, 0.3, BATCH, 0.3)) == [Release(0, 2, BATCH), Release(1, 1, BATCH)]
    assert p.handle(Pushed(0, 2, 0.4, BATCH, 0.1)) == []
    assert p.handle(Left(1, 0.5)) == [Release(0, 3, BATCH)]  # the slowest left: unblock
    p.handle(Joined(2, 0.6))  # a newcomer starts at the slowest clock, not at 0
    assert p.window.low == 3 and p.clock[2] == 3


def test_ssp_clock_table_is_a_window_independent_of_the_number_of_workers():
    p = make_policy("ssp", BATCH, staleness=2)
    for w in range(500):
        p.handle(Joined(w, 0.0))
    for step in range(3):
        for w in range(500):
            p.handle(Pushed(w, step, float(step), BATCH, 0.1))
    assert len(p.window.counts) == 4 and p.window.low == 3 and sum(p.window.counts) == 500


@settings(max_examples=25, deadline=None)
@given(workers=worker_scripts(), s=st.integers(0, 4))
def test_ssp_bound_holds_for_any_staleness(workers, s):
    run_checked("ssp", {"staleness": s}, workers)


def test_dssp_lets_a_fast_worker_fill_the_wait_for_the_slowest():
    p = make_policy("dssp", BATCH, staleness=1, r_max=3)
    for w in (0, 1):
        p.handle(Joined(w, 0.0))
    assert p.handle(Pushed(0, 0, 1.0, BATCH, 1.0)) == [Release(0, 1, BATCH)]
    assert p.handle(Pushed(0, 1, 2.0, BATCH, 1.0)) == []  # slowest not timed yet: plain SSP
    out = p.handle(Pushed(1, 0, 4.0, BATCH, 4.0))  # steps: fast 1 s, slow 4 s
    assert out == [Release(0, 2, BATCH), Release(1, 1, BATCH)]
    # Fast worker 2 ahead at t=5; the slowest pushes next at 4 + 4 = 8: r* = 3 extra steps.
    for step, now in ((2, 5.0), (3, 6.0), (4, 7.0)):
        assert p.handle(Pushed(0, step, now, BATCH, 1.0)) == [Release(0, step + 1, BATCH)]
    assert p.handle(Pushed(0, 5, 8.0, BATCH, 1.0)) == []  # 5 ahead > s + r_max
    assert p.handle(Pushed(1, 1, 8.0, BATCH, 4.0)) == [Release(0, 6, BATCH), Release(1, 2, BATCH)]
    ssp = make_policy("ssp", BATCH, staleness=1)
    for w in (0, 1):
        ssp.handle(Joined(w, 0.0))
    ssp.handle(Pushed(0, 0, 1.0, BATCH, 1.0))
    assert ssp.handle(Pushed(0, 1, 2.0, BATCH, 1.0)) == []


# ---- R2SP ---------------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 6), per_sample=st.floats(1e-4, 1e-3), steps=st.integers(12, 40),
       warmup=st.integers(0, 5))
def test_r2sp_staleness_is_at_most_n_minus_1_with_steady_steps(n, per_sample, steps, warmup):
    workers = [VirtualWorker(w, 0.0, steps, None, per_sample) for w in range(n)]
    _, trace, mon = run_checked("r2sp", {"warmup": warmup}, workers)
    late = [p for p in trace.pushes if p.time - p.compute_time >= mon.rotating_since]
    assert late and max(p.staleness for p in late) <= n - 1
    assert mon.gaps and all(got >= want - 1e-12 for got, want in mon.gaps)


def test_r2sp_permissions_go_round_robin_and_are_spaced():
    p = make_policy("r2sp", BATCH, warmup=1, gap_ratio=0.5, ema=1.0)
    for w in range(3):
        p.handle(Joined(w, 0.0))
    assert p.handle(Pushed(1, 0, 1.0, BATCH, 1.0))[1] == Release(1, 1, BATCH)  # starts rotation
    assert p.handle(Pushed(0, 0, 1.2, BATCH, 1.2)) == []  # turn is 2's, 0 waits
    out = p.handle(Pushed(2, 0, 1.3, BATCH, 1.3))
    assert out == [Release(2, 1, BATCH), Release(0, 1, BATCH)]
    assert p.handle(Pushed(1, 1, 3.0, BATCH, 1.0)) == [Release(1, 2, BATCH)]  # gap long past
    (out,) = p.handle(Pushed(2, 1, 3.0, BATCH, 1.0))  # T = 1.7: r*T/N after the last one
    assert (out.worker, out.step) == (2, 2)
    assert out.not_before == pytest.approx(3.0 + 0.5 * 1.7 / 3)
    (out2,) = p.handle(Pushed(0, 1, 3.1, BATCH, 1.0))  # T = 1.9
    assert out2.not_before == pytest.approx(out.not_before + 0.5 * 1.9 / 3)


def test_r2sp_turn_passes_on_when_its_holder_dies():
    p = make_policy("r2sp", BATCH, warmup=0)
    for w in range(3):
        p.handle(Joined(w, 0.0))
    p.handle(Pushed(0, 0, 1.0, BATCH, 1.0))  # rotation starts at 0; turn -> 1
    assert p.handle(Pushed(2, 0, 1.1, BATCH, 1.1)) == []  # 2 waits for 1
    assert p.handle(Left(1, 1.2, "dead")) == [Release(2, 1, BATCH)]


def test_r2sp_heterogeneous_grows_the_batch_of_a_worker_that_waits():
    p = make_policy("r2sp", BATCH, warmup=0, heterogeneous=True, gap_ratio=0.0)
    for w in range(2):
        p.handle(Joined(w, 0.0))
    p.handle(Pushed(0, 0, 1.0, BATCH, 1.0))  # rotation starts at 0 ...
    assert p.handle(Pushed(0, 1, 1.5, BATCH, 0.5)) == []  # ... and 0 waits for 1's turn
    out = p.handle(Pushed(1, 0, 2.0, BATCH, 2.0))
    fast = next(d for d in out if d.worker == 0)
    # v = 8 / 0.5 = 16 samples/s, blocked 0.5 s: b' = 8 + 8 = 16, update scaled 16 / 8.
    assert (fast.batch_size, fast.scale) == (16, 2.0)
    slow = next(d for d in out if d.worker == 1)
    assert (slow.batch_size, slow.scale) == (BATCH, 1.0)


# ---- LB-BSP -------------------------------------------------------------------------------------

def test_lbbsp_gives_the_faster_worker_the_larger_batch_and_equalizes_rounds():
    workers = [VirtualWorker(0, 0.0, 12, None, 1e-3), VirtualWorker(1, 0.0, 12, None, 3e-3)]
    _, trace, _ = run_checked("lbbsp", {"predictor": "last"}, workers)
    last = trace.notes[-1][1].data
    assert last["batch"] == [12, 4] and last["global_batch"] == 16
    final = [p for p in trace.pushes if p.step == 11]
    assert final[0].compute_time == pytest.approx(final[1].compute_time)


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1, 200), lo=st.integers(1, 10), span=st.integers(0, 60),
       speeds=st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 1e3)), min_size=1, max_size=8))
def test_batch_split_sums_to_the_total_within_bounds_and_follows_speed(total, lo, span, speeds):
    hi = lo + span
    sizes = split_batch(total, speeds, lo, hi)
    check_allocation({"batch": sizes, "speed": speeds, "global_batch": total},
                     {"min_batch": lo, "max_batch": hi})
    n = len(speeds)
    if n * lo > total:
        assert sizes == [lo] * n  # infeasible: as close as the bounds allow
    if n * hi < total:
        assert sizes == [hi] * n


def test_batch_split_is_proportional_when_unclamped():
    assert split_batch(100, [1, 1, 2]) == [25, 25, 50]
    assert split_batch(10, [1, 1, 1]) == [4, 3, 3]  # largest remainder, ties to lower index
    assert split_batch(40, [1, 9], lo=10) == [10, 30]


# ---- ElasticBSP against an exhaustive search ----------------------------------------------------

def exhaustive(rows: list[list[float]]) -> tuple[float, float]:
    """Smallest spread over one point per row; among equal spreads the earliest barrier."""
    best = None
    for combo in itertools.product(*rows):
        key = (max(combo) - min(combo), max(combo))
        best = key if best is None or key < best else best
    return best


@settings(max_examples=20, deadline=None)
@given(costs=st.lists(st.integers(2, 40), min_size=1, max_size=4),
       lookahead=st.integers(1, 5), variant=st.sampled_from(["zipline", "zipline-opt",
                                                               "zipline-opt-bs", "zipline-vec"]))
def test_ebsp_barriers_fall_at_the_exhaustive_optimum(costs, lookahead, variant):
    # Step costs in 1/1024 s are exact binary fractions: predictions are exact, so barriers
    # land where planned and ties are real ties.
    workers = [VirtualWorker(w, 0.0, 25, None, c / 1024 / BATCH) for w, c in enumerate(costs)]
    kw = {"lookahead": lookahead, "variant": variant}
    _, trace, mon = run_checked("ebsp", kw, workers)
    assert mon.plans
    for t, plan, seen in mon.plans:
        rows = []
        for w in plan["workers"]:
            mine = [p.time for p in trace.pushes[:seen] if p.worker == w]
            last, step = mine[-1], mine[-1] - mine[-2]
            first = 0 if w == plan["waiting"] else 1
            rows.append([last + r * step for r in range(first, first + lookahead)])
        spread, barrier = exhaustive(rows)
        assert (plan["spread"], plan["barrier"]) == (spread, barrier)
        barrier = mon.next_barrier(t)
        if barrier and set(barrier[1]["workers"]) == set(plan["workers"]):
            assert barrier[0] == plan["barrier"]


def test_ebsp_newcomer_after_the_plan_waits_for_the_barrier():
    p = make_policy("ebsp", BATCH, lookahead=3)
    for w in (0, 1):
        p.handle(Joined(w, 0.0))
    for k in range(2):
        p.handle(Pushed(0, k, 1.0 + k, BATCH, 1.0))
    p.handle(Pushed(1, 0, 3.0, BATCH, 3.0))
    out = p.handle(Pushed(1, 1, 6.0, BATCH, 3.0))  # monitoring complete: plan
    assert out[0].kind == "ebsp_plan" and p.planned
    assert p.handle(Joined(2, 6.5)) == []  # held until the barrier
    decisions = p.handle(Left(0, 7.0)) + p.handle(Left(1, 7.0))
    assert Release(2, 0, BATCH) in decisions and not p.planned


def test_integer_options_refuse_floats_and_bools_with_the_option_named():
    with pytest.raises(ValueError, match="staleness must be an integer"):
        make_policy("ssp", BATCH, staleness=1.5)
    with pytest.raises(ValueError, match="lookahead must be an integer"):
        make_policy("ebsp", BATCH, lookahead=True)
