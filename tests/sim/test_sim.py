"""The discrete-event simulator: timing by hand, policy structure, staleness, replay, logs, CLI."""

import ast
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paramserver.cli.main import main
from paramserver.runlog.metrics import read_records, summarize
from paramserver.policies import SYNC_POLICIES, ApplyRound, Release, make_policy
from paramserver.sim import (
    ComputeSpecError, Engine, Network, NullSink, SimConfig, SimError, Simulation, parse_compute,
    simulate,
)
from paramserver.sim.summary import summarize_run
from paramserver.sim.trace import load_trace
from paramserver.core.units import UnitError, parse_bandwidth, parse_duration, parse_size
from paramserver.emulation.stragglers import parse_straggler
from ps_helpers import RUNTIME

POLICIES = SYNC_POLICIES.names()


class Capture(NullSink):
    """Keeps the exact (unrounded) values the engine hands to its sink."""

    def __init__(self):
        self.steps, self.events = [], []

    def step(self, t, w, step, batch, compute, wait, pull, push, staleness, factor, extra):
        self.steps.append(dict(t=t, worker=w, step=step, batch=batch, compute_s=compute,
                               wait_s=wait, pull_s=pull, push_s=push, staleness=staleness))

    def event(self, t, kind, data):
        self.events.append((t, kind, data))


def run_engine(sync, workers, steps, compute="const:1ms", straggler=None, net=None, batch=10,
               seed=0, **options):
    sink = Capture()
    cost = parse_compute(compute).bind(workers, steps, seed)
    engine = Engine(make_policy(sync, batch, **options), workers, steps, cost,
                    net or Network(), sink=sink,
                    straggler=parse_straggler(straggler) if straggler else None)
    engine.run()
    return engine, sink


def by_worker_step(records):
    return {(r["worker"], r["step"]): r for r in records}


# ---- timing, by hand ----------------------------------------------------------------------------
def test_bsp_fastest_worker_waits_exactly_the_difference_to_the_slowest():
    # 4 workers, 10 samples x 1 ms = 10 ms a step; worker 3 is 3x slower: rounds of 30 ms.
    engine, sink = run_engine("bsp", 4, 5, straggler="3:3")
    recs = by_worker_step(sink.steps)
    assert engine.now == pytest.approx(5 * 0.030)
    for k in range(5):
        assert recs[(3, k)]["t"] == pytest.approx(0.030 * (k + 1))
        assert recs[(3, k)]["wait_s"] == pytest.approx(0.0, abs=1e-12)
        for w in range(3):
            assert recs[(w, k)]["t"] == pytest.approx(0.030 * k + 0.010)
            assert recs[(w, k)]["wait_s"] == pytest.approx(0.0 if k == 0 else 0.020)


def test_bsp_pulls_and_pushes_queue_on_the_server_links():
    # 1 MB at 1 GB/s: 1 ms per transfer. Worker 0 computes 10 ms, worker 1 20 ms. The round:
    # pulls end at 1 and 2 ms, pushes apply at 12 and 23 ms; next round starts at 23 ms.
    net = Network(model_bytes=1e6, bandwidth=1e9, latency=0.0)
    engine, sink = run_engine("bsp", 2, 3, straggler="1:2", net=net)
    recs = by_worker_step(sink.steps)
    for k in range(3):
        r0, r1 = recs[(0, k)], recs[(1, k)]
        assert r0["t"] == pytest.approx(0.023 * k + 0.012)
        assert r1["t"] == pytest.approx(0.023 * k + 0.023)
        assert (r0["pull_s"], r1["pull_s"]) == pytest.approx((0.001, 0.002))
        assert (r0["push_s"], r1["push_s"]) == pytest.approx((0.001, 0.001))
        assert r0["wait_s"] == pytest.approx(0.0 if k == 0 else 0.011)


def test_one_worker_step_is_six_latencies_two_transfers_and_the_compute():
    L, tx, C = 0.0005, 0.002, 0.010  # 2 MB at 1 GB/s
    engine, sink = run_engine("asp", 1, 4, net=Network(2e6, 1e9, L))
    period = 6 * L + 2 * tx + C
    for k, r in enumerate(sink.steps):
        assert r["t"] == pytest.approx((k + 1) * period)
        assert r["wait_s"] == pytest.approx(L if k == 0 else 2 * L)
        assert r["pull_s"] == pytest.approx(2 * L + tx)
        assert r["push_s"] == pytest.approx(2 * L + tx)
        assert r["compute_s"] == pytest.approx(C)


# ---- structure of the policies ------------------------------------------------------------------
def test_bsp_every_step_of_round_k_ends_before_any_step_of_round_k_plus_1_starts():
    engine, sink = run_engine("bsp", 50, 8, compute="lognormal:1ms:0.5",
                              net=Network(1e5, 1e9, 0.0))
    for k in range(7):
        end_k = max(r["t"] for r in sink.steps if r["step"] == k)
        start_next = min(r["t"] - r["push_s"] - r["compute_s"] - r["pull_s"]
                         for r in sink.steps if r["step"] == k + 1)
        assert start_next >= end_k - 1e-12
    rounds = [e for e in sink.events if e[1] == "apply_round"]
    assert [d["step"] for _, _, d in rounds] == list(range(8))
    assert all(r["staleness"] == 0 for r in sink.steps)


def test_asp_never_waits_without_latency():
    _, sink = run_engine("asp", 30, 10, compute="classes:0.5=1,0.5=4+lognormal:0.3",
                         net=Network(1e5, 1e9, 0.0))
    assert len(sink.steps) == 300
    assert all(r["wait_s"] == 0 for r in sink.steps)


@pytest.mark.parametrize("sync", ["asp", "ssp", "ebsp", "r2sp"])
def test_staleness_equals_a_recomputation_from_the_push_order(sync):
    # Arrival mode: the version is the number of pushes applied. Without latency a push is
    # applied at its clock time t and the pull was read at t - push - compute - pull.
    _, sink = run_engine(sync, 40, 15, compute="classes:0.7=1,0.3=2.5+lognormal:0.4",
                         net=Network(2e5, 1e9, 0.0))
    applies = sorted(r["t"] for r in sink.steps)
    assert len(set(applies)) == len(applies)
    stale = []
    for r in sink.steps:
        read = r["t"] - r["push_s"] - r["compute_s"] - r["pull_s"]
        pulled = sum(1 for a in applies if a <= read + 1e-9)
        stale.append(applies.index(r["t"]) - pulled)
    assert [r["staleness"] for r in sink.steps] == stale
    assert max(stale) > 0


def test_ssp_keeps_workers_within_the_staleness_bound():
    s = 2
    _, sink = run_engine("ssp", 10, 20, compute="classes:0.9=1,0.1=5", staleness=s)
    done = {w: 0 for w in range(10)}
    for r in sorted(sink.steps, key=lambda r: r["t"]):
        # a worker may start step c only if c - min clock <= s
        assert r["step"] - min(done.values()) <= s + 1
        done[r["worker"]] = r["step"] + 1


@pytest.mark.parametrize("sync", POLICIES)
def test_every_policy_runs_200_workers_without_deadlock_and_summarize_accepts_the_log(
        sync, tmp_path):
    cfg = SimConfig(sync=sync, workers=200, steps=30, param_bytes="2MB",
                    compute="classes:0.8=1,0.2=3+lognormal:0.3", latency="20us")
    s = simulate(cfg, tmp_path)
    records = read_records(tmp_path / "metrics.jsonl")
    assert s["steps"] == 6000 and len(s["per_worker"]) == 200
    assert sum(r["kind"] == "left" for r in records) == 200
    assert summarize(records, json.loads((tmp_path / "job.json").read_text()))["steps"] == 6000
    assert s["simulator"]["complete"] and 0 <= s["mean_wait_fraction"] < 1
    assert s["updates_applied"] == (30 if SYNC_POLICIES.get(sync).apply_mode == "round" else 6000)


@pytest.mark.parametrize("sync", POLICIES)
def test_2000_workers_20_steps_finish_in_bounded_time(sync):
    t0 = time.perf_counter()
    engine, _ = run_engine(sync, 2000, 20, compute="lognormal:2ms:0.3",
                           net=Network(1e6, 1.25e9, 50e-6))
    assert engine.steps_done == 40_000
    assert time.perf_counter() - t0 < 60  # ~2 s on an idle core; generous for busy machines


def test_a_policy_that_breaks_the_protocol_is_reported():
    class Twice(type(make_policy("asp", 1))):
        def on_pushed(self, event):
            return super().on_pushed(event) * 2

    sink = Capture()
    engine = Engine(Twice(4), 2, 3, parse_compute("const:1ms").bind(2, 3), Network(), sink)
    with pytest.raises(SimError, match="release"):
        engine.run()


def test_breaches_the_policy_host_sees_are_reported_as_sim_errors():
    class Rounding(type(make_policy("asp", 1))):
        def on_pushed(self, event):
            return [ApplyRound(event.step)] + super().on_pushed(event)

    engine = Engine(Rounding(4), 2, 3, parse_compute("const:1ms").bind(2, 3), Network())
    with pytest.raises(SimError, match="arrival-mode"):
        engine.run()


def test_timed_decisions_come_from_ticks_at_the_policys_deadline():
    class Delayed(type(make_policy("asp", 1))):
        """Releases each next step 5 ms after the push, from a Tick."""

        pending: list

        def on_pushed(self, event):
            super().on_pushed(event)
            self.pending = getattr(self, "pending", []) + [(event.now + 0.005, event.worker,
                                                             event.step + 1)]
            return []

        def next_deadline(self):
            return min(self.pending)[0] if getattr(self, "pending", None) else None

        def on_tick(self, event):
            due = [p for p in self.pending if p[0] <= event.now]
            self.pending = [p for p in self.pending if p[0] > event.now]
            return [Release(w, step, self.batch_size) for _, w, step in due]

    sink = Capture()
    engine = Engine(Delayed(10), 3, 4, parse_compute("classes:0.34=1,0.66=2").bind(3, 4),
                    Network(), sink)
    engine.run()
    assert len(sink.steps) == 12
    assert all(r["wait_s"] == pytest.approx(0.0 if r["step"] == 0 else 0.005) for r in sink.steps)


def test_a_deadlock_is_reported():
    class Stuck(type(make_policy("asp", 1))):
        def on_pushed(self, event):
            return [] if event.worker == 1 else super().on_pushed(event)

    engine = Engine(Stuck(4), 2, 3, parse_compute("const:1ms").bind(2, 3), Network())
    with pytest.raises(SimError, match="deadlock"):
        engine.run()


# ---- run folders, determinism, replay -----------------------------------------------------------
def test_same_seed_same_log_other_seed_other_log(tmp_path):
    def run(name, seed):
        cfg = SimConfig(sync="r2sp", workers=60, steps=20, param_bytes="1MB", seed=seed,
                        compute="lognormal:2ms:0.5", straggler="random:0.1:3")
        simulate(cfg, tmp_path / name)
        return [(tmp_path / name / f).read_bytes() for f in ("metrics.jsonl", "events.jsonl")]

    assert run("a", 7) == run("b", 7)
    assert run("c", 8)[0] != run("a", 7)[0]


def _write_metrics(path, compute):
    lines = [json.dumps({"t": 0.0, "kind": "eval", "accuracy": 0.1})]
    for step in range(len(compute[0])):
        for w, seq in enumerate(compute):
            lines.append(json.dumps({"t": step + w / 10, "kind": "step", "worker": w,
                                     "step": step, "batch": 16, "compute_s": seq[step]}))
    path.write_text("\n".join(lines) + "\n")


def test_replay_of_a_metrics_log_reproduces_its_compute_times(tmp_path):
    compute = [[0.012345, 0.02, 0.017001], [0.1, 0.050505, 0.07], [0.003, 0.004, 0.005]]
    trace = tmp_path / "live" / "metrics.jsonl"
    trace.parent.mkdir()
    _write_metrics(trace, compute)
    cfg = SimConfig(sync="asp", workers=3, steps=3, batch_size=16, param_bytes="1MB",
                    compute=f"trace:{trace.parent}")
    simulate(cfg, tmp_path / "sim")
    recs = [r for r in read_records(tmp_path / "sim" / "metrics.jsonl") if r["kind"] == "step"]
    assert {(r["worker"], r["step"]): r["compute_s"] for r in recs} == {
        (w, s): compute[w][s] for w in range(3) for s in range(3)}


def test_replay_wraps_round_maps_workers_modulo_and_scales_by_batch(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("worker,step,compute_s,batch\n0,1,0.2,8\n0,0,0.1,8\n1,0,0.3,8\n")
    cost = parse_compute(f"trace:{csv}", load_trace).bind(4, 3, 0)
    assert [cost(0, s, 8) for s in range(3)] == [0.1, 0.2, 0.1]
    assert cost(3, 0, 8) == 0.3 and cost(2, 1, 16) == pytest.approx(0.4)


def test_summary_in_worker_groups_equals_the_direct_summary(tmp_path):
    cfg = SimConfig(sync="ssp", workers=30, steps=10, param_bytes="1MB",
                    compute="lognormal:1ms:0.4")
    direct = simulate(cfg, tmp_path)
    job = json.loads((tmp_path / "job.json").read_text())
    grouped = summarize_run(tmp_path / "metrics.jsonl", job, 30, 10, max_records=70)
    for key in ("steps", "samples", "wall_time_s", "updates_applied", "per_worker"):
        assert grouped[key] == direct[key], key
    for key in ("mean_wait_fraction", "mean_staleness", "steps_per_s"):
        assert grouped[key] == pytest.approx(direct[key]), key


def test_the_engine_reads_no_clock_and_does_no_io():
    import paramserver.sim as sim
    for path in ("sim/core/engine.py", "sim/core/comm.py", "sim/core/compute.py", "core/units.py",
                 "sim/trace.py"):
        tree = ast.parse((Path(sim.__file__).parent.parent / path).read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not {n.split(".")[0] for n in names} & {"time", "threading", "socket", "zmq",
                                                       "pickle", "subprocess", "datetime"}, path
        assert not [n for n in names if n.startswith(RUNTIME + ("paramserver.cli",))]


def test_importing_the_simulator_loads_neither_zmq_nor_torch():
    code = ("import sys, paramserver.sim, paramserver.sim.run, paramserver.sim.core.engine, "
            "paramserver.sim.train, paramserver.sim.replay; "
            "print(sorted(m for m in ('zmq', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- grammars -----------------------------------------------------------------------------------
def test_compute_models():
    assert parse_compute("const:2ms").bind(3, 2)(1, 0, 32) == pytest.approx(0.064)
    classes = parse_compute("classes:0.5=1,0.25=2,0.25=4").bind(8, 1)
    assert [classes(w, 0, 1) / 0.002 for w in range(8)] == pytest.approx([1, 1, 1, 1, 2, 2, 4, 4])
    noise = parse_compute("lognormal:1ms:0.3").bind(200, 50, seed=3)
    draws = [noise(w, s, 1) / 1e-3 for w in range(200) for s in range(50)]
    assert sum(draws) / len(draws) == pytest.approx(1.0, abs=0.02)
    assert noise(5, 7, 1) == parse_compute("lognormal:1ms:0.3").bind(200, 50, seed=3)(5, 7, 1)
    both = parse_compute("const:1ms+classes:0.5=1,0.5=3").bind(2, 1)
    assert both(1, 0, 10) == pytest.approx(0.03)


@pytest.mark.parametrize("spec", ["nope:1", "const:2", "const:2ms+trace:x", "classes:0.5=1",
                                  "classes:1", "lognormal:a", "lognormal:1ms:-1", "trace:/no/such",
                                  "const:0ms"])
def test_bad_compute_specs_fail_with_a_message(spec):
    with pytest.raises(ComputeSpecError, match="--compute"):
        parse_compute(spec, load_trace)


def test_the_pure_compute_parser_reads_no_trace_without_a_loader(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("worker,step,compute_s,batch\n0,0,0.1,8\n")
    with pytest.raises(ComputeSpecError, match="read by the caller"):
        parse_compute(f"trace:{csv}")
    assert parse_compute(f"trace:{csv}", load_trace).bind(1, 1)(0, 0, 8) == 0.1


def test_units():
    assert parse_duration("250us") == pytest.approx(250e-6) and parse_duration("0") == 0
    assert parse_size("45MB") == 45e6 and parse_size("1KiB") == 1024
    assert parse_bandwidth("10Gbit/s") == pytest.approx(1.25e9)
    assert parse_bandwidth("800Mbps") == pytest.approx(1e8)
    assert parse_bandwidth("1.25GB/s") == pytest.approx(1.25e9)
    assert parse_bandwidth("inf") == math.inf
    for bad, fn in (("2", parse_duration), ("fast", parse_bandwidth), ("3 apples", parse_size)):
        with pytest.raises(UnitError):
            fn(bad)


# ---- the command --------------------------------------------------------------------------------
def test_cli_writes_a_run_folder_and_prints_the_summary(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["simulate", "--sync", "ssp", "--sync-opt", "staleness=2", "--workers", "40",
                 "--steps", "10", "--compute", "classes:0.9=1,0.1=3", "--param-bytes", "4MB",
                 "--bandwidth", "1GB/s", "--latency", "100us", "--out", str(out), "--quiet"])
    assert code == 0
    text = capsys.readouterr().out
    assert "virtual s" in text and "events/s" in text and "mean wait" in text
    for name in ("config.json", "job.json", "metrics.jsonl", "events.jsonl", "summary.json"):
        assert (out / name).exists(), name
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 400 and s["simulator"]["events_per_s"] > 0


def test_without_a_terminal_progress_comes_as_plain_lines(tmp_path, capsys, monkeypatch):
    """A log file gets no progress bar (rich draws it only at the end there) but a line every
    PLAIN_EVERY seconds, each further on than the one before."""
    monkeypatch.setattr("paramserver.cli.simulate_cmd.CHUNK", 500)
    monkeypatch.setattr("paramserver.cli.simulate_cmd.PLAIN_EVERY", 0.0)
    assert main(["simulate", "--workers", "20", "--steps", "100", "--out",
                 str(tmp_path / "run")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("bsp x20 (sim):")]
    assert len(lines) >= 2, lines
    done = [int(ln.split(": ")[1].split(" of ")[0].replace(",", "")) for ln in lines]
    assert done == sorted(done) and done[0] < done[-1] <= 2000
    assert all(" of 2,000 steps (" in ln and "events/s" in ln for ln in lines)


def test_cli_rejects_bad_options(tmp_path, capsys):
    assert main(["simulate", "--compute", "bogus", "--out", str(tmp_path), "--quiet"]) == 2
    assert "--compute" in capsys.readouterr().err


def test_ctrl_c_stops_cleanly_and_keeps_what_was_written(tmp_path, capsys, monkeypatch):
    calls = []
    real = Simulation.advance

    def interrupted(self, max_events=None):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(self, max_events)

    monkeypatch.setattr(Simulation, "advance", interrupted)
    monkeypatch.setattr("paramserver.cli.simulate_cmd.CHUNK", 500)
    out = tmp_path / "run"
    code = main(["simulate", "--workers", "100", "--steps", "50", "--param-bytes", "1MB",
                 "--out", str(out), "--quiet"])
    assert code == 130
    s = json.loads((out / "summary.json").read_text())
    assert not s["simulator"]["complete"] and 0 < s["steps"] < 5000
    assert "interrupted" in capsys.readouterr().out


def test_auto_counts_no_staleness_in_its_lockstep_rounds(tmp_path):
    """The simulated shards apply auto's pushes on arrival; under its lockstep candidates each
    release names the round's size and the round's other pushes are not staleness (as under
    fixed BSP); under ASP every other worker's push since the pull is."""
    stale = {}
    for candidates in ("lbbsp,bsp", "asp"):
        out = tmp_path / candidates.replace(",", "-")
        assert main(["simulate", "--sync", "auto", "--sync-opt", f"candidates={candidates}",
                     "--workers", "4", "--steps", "60", "--compute", "const:1ms",
                     "--straggler", "1:3", "--quiet", "--out", str(out)]) == 0
        stale[candidates] = json.loads((out / "summary.json").read_text())["mean_staleness"]
    assert stale["lbbsp,bsp"] == 0 and stale["asp"] > 1
