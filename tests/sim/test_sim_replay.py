"""Replaying a live run in the simulator: the budget, recorded communication, decisions, timing.

The first tests are synthetic and fast. The last two make small live runs (3 workers, worker 1
3x slower, 1 ms/sample emulated device time, 3 epochs: about 45 BSP rounds) and replay them.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from paramserver.cli.main import main
from paramserver.policies import Release, make_policy
from paramserver.sim import Engine, Network, NullSink, parse_compute
from paramserver.sim.replay import check_log, decision_log, load_run, mirror_config, replay
from paramserver.sim.run import simulate
from paramserver.sim.trace import CommReplay


class Capture(NullSink):
    def __init__(self):
        self.steps, self.events = [], []

    def step(self, t, w, step, batch, compute, wait, pull, push, staleness, factor, extra):
        self.steps.append(dict(t=t, worker=w, step=step, batch=batch, compute_s=compute,
                               wait_s=wait, pull_s=pull, push_s=push, extra=extra))

    def event(self, t, kind, data):
        self.events.append((t, kind, data))


def run_budget(sync, workers, budget, compute="classes:0.5=1,0.5=3", batch=10, policy=None):
    sink = Capture()
    cost = parse_compute(f"const:1ms+{compute}").bind(workers, 10)
    engine = Engine(policy or make_policy(sync, batch), workers, None, cost, Network(),
                    sink=sink, max_samples=budget)
    engine.run()
    return engine, sink


# ---- the shared sample budget -------------------------------------------------------------------
def test_asp_budget_stops_every_release_after_the_clock_that_reaches_it():
    engine, sink = run_budget("asp", 4, 300)
    t_budget = next(t for t, kind, _ in sink.events if kind == "budget_reached")
    before = [r for r in sink.steps if r["t"] <= t_budget]
    assert sum(r["batch"] for r in before) == 300  # 10-sample steps: exactly the 30th clock
    # After it only the steps already released finish: at most one per other worker.
    after = [r for r in sink.steps if r["t"] > t_budget]
    assert len(after) <= 3 and len({r["worker"] for r in after}) == len(after)
    assert engine.stopping and engine.samples == sum(r["batch"] for r in sink.steps)
    assert engine.total_steps is None


def test_bsp_budget_mid_round_finishes_the_round_for_everyone():
    engine, sink = run_budget("bsp", 4, 250)  # 6.25 rounds of 40 samples
    per_worker = [sum(r["worker"] == w for r in sink.steps) for w in range(4)]
    assert per_worker == [7] * 4 and engine.rounds == 7


def test_a_release_held_for_not_before_says_stop_if_the_budget_ran_out_meanwhile():
    class Spaced(type(make_policy("asp", 1))):
        """ASP, each release held 50 ms."""

        def on_pushed(self, event):
            return [Release(d.worker, d.step, d.batch_size, event.now + 0.05)
                    for d in super().on_pushed(event)]

    # Worker 0: 10 ms steps, worker 1: 30 ms. The budget falls at worker 1's first clock
    # (t = 30 ms) while worker 0's release decided at 10 ms is still held until 60 ms.
    engine, sink = run_budget(None, 2, 20, policy=Spaced(10))
    assert [(r["worker"], r["step"]) for r in sink.steps] == [(0, 0), (1, 0)]


# ---- replayed communication ---------------------------------------------------------------------
def live_like_log(folder, round_trip=0.002, workers=2, budget_steps=9):
    """An ASP run as the coordinator writes it, with known timing pieces and a sample budget."""
    clocks, half = [], round_trip / 2
    for w in range(workers):
        t = half  # the release of step 0 reaches the worker L after the barrier opened
        for s in range(3 * budget_steps):
            pull, push = 0.003 + 0.001 * w, 0.002 + 0.0005 * (s % 4)
            compute, gap = (0.010 if w == 0 else 0.030), 0.0004 * (s % 3)
            wait = 0.2 + 0.1 * w + half if s == 0 else round_trip
            t_clock = t + pull + compute + gap + push + half
            clocks.append({"t": round(t_clock, 6), "kind": "step", "worker": w, "step": s,
                           "batch": 16, "compute_s": compute, "real_compute_s": compute / 4,
                           "wait_s": wait, "pull_s": pull, "push_s": push, "staleness": 0})
            t = t_clock + half
    clocks.sort(key=lambda r: r["t"])
    t_budget = clocks[budget_steps - 1]["t"]
    last = {}  # a step runs if it was released before the budget was reached
    records = []
    for r in clocks:
        w = r["worker"]
        if r["step"] == 0 or last[w] < t_budget:
            records.append(r)
            last[w] = r["t"]
    records += [{"t": max(last.values()) + 0.001, "kind": "left", "worker": w, "reason": "done"}
                for w in range(workers)]
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    job = {"num_keys": 1000, "dtype": "float32", "servers": 1, "workers": workers,
           "batch_size": 16, "sync": {"name": "asp", "options": {}},
           "max_samples": 16 * budget_steps, "task": {"model": "mlp", "dataset": "digits"}}
    (folder / "config.json").write_text(json.dumps({"config": {}, "job": job}))
    (folder / "events.jsonl").write_text("")
    return [r for r in records if r["kind"] == "step"]


def test_comm_replay_recovers_the_unrecorded_step_time_and_the_start_wait(tmp_path):
    records = live_like_log(tmp_path / "live")
    comm = CommReplay(tmp_path / "live", 0.001, 0.001)
    assert [comm.overhead(0, s) for s in range(6)] == pytest.approx([0, 4e-4, 8e-4] * 2, abs=2e-6)
    assert comm.overhead(1, 1) == pytest.approx(4e-4, abs=2e-6)
    assert comm.start_wait(1) == pytest.approx(0.3)
    assert (comm.pull(1, 2), comm.push(0, 5)) == pytest.approx((0.004, 0.0025))
    assert comm.pull(1, 99) == pytest.approx(0.004)  # past the record: the worker's mean
    assert comm.real(0, 0) == 0.0025 and comm.real(0, 99) is None
    assert len(records) == 10  # 9 to the budget, and worker 1's step in flight


def test_replay_of_a_known_log_reproduces_every_clock_time(tmp_path):
    records = live_like_log(tmp_path / "live")
    r = replay(tmp_path / "live", tmp_path / "sim")
    assert r["calibration"]["round_trip_s"] == pytest.approx(0.002)
    sim = {(x["worker"], x["step"]): x for x in load_run(tmp_path / "sim").steps}
    assert sim.keys() == {(x["worker"], x["step"]) for x in records}
    for x in records:
        y = sim[(x["worker"], x["step"])]
        assert y["t"] == pytest.approx(x["t"], abs=3e-6)
        assert (y["wait_s"], y["pull_s"], y["push_s"]) == pytest.approx(
            (x["wait_s"], x["pull_s"], x["push_s"]), abs=2e-6)
        assert y["real_compute_s"] == pytest.approx(x["real_compute_s"])
    assert all(abs(e) < 1e-4 for e in r["error"].values())
    assert r["decisions"]["trigger_agreement"] == 1.0 and r["decisions"]["steps_max_diff"] == 0


def test_the_decision_log_of_a_simulated_run_matches_its_events(tmp_path):
    live_like_log(tmp_path / "live")
    for sync in ("bsp", "ebsp", "r2sp", "lbbsp", "auto"):
        cfg = json.loads((tmp_path / "live" / "config.json").read_text())
        cfg["job"]["sync"]["name"] = sync
        cfg["job"]["max_samples"] = 2000
        (tmp_path / "live" / "config.json").write_text(json.dumps(cfg))
        simulate(mirror_config(load_run(tmp_path / "live"), 0.002), tmp_path / sync)
        run = load_run(tmp_path / sync)
        log = decision_log(run)
        assert check_log(run, log) == [], sync
        assert len(log.releases) == len(run.steps) + 2  # + the stop releases of both workers


def test_cli_simulates_a_replay_with_a_budget(tmp_path, capsys):
    live_like_log(tmp_path / "live")
    code = main(["simulate", "--sync", "ssp", "--workers", "2", "--batch-size", "16",
                 "--max-samples", "100", "--compute", f"trace:{tmp_path / 'live'}",
                 "--comm", f"trace:{tmp_path / 'live'}", "--latency", "1ms",
                 "--param-bytes", "4KB", "--out", str(tmp_path / "sim"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["samples"] >= 100 and summary["simulator"]["budget_reached"]
    assert summary["real_compute_share"] == pytest.approx(0.25, abs=0.01)
    assert main(["simulate", "--comm", "nope:x", "--out", str(tmp_path / "x"), "--quiet"]) == 2


@pytest.mark.parametrize("flag", ["--comm", "--compute"])
def test_a_trace_folder_without_its_metrics_names_the_file_it_looked_for(flag, tmp_path,
                                                                         capsys):
    """(It named the folder, which exists, with 'No such file or directory'.)"""
    folder = tmp_path / "not-a-run"
    folder.mkdir()
    assert main(["simulate", "--steps", "5", flag, f"trace:{folder}", "--out",
                 str(tmp_path / "sim"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"cannot read trace '{folder / 'metrics.jsonl'}': No such file or directory" in err


# ---- live runs, replayed ------------------------------------------------------------------------
# Tolerance: the issue asks for 15% at 4 workers over a 12-epoch run; these runs are ~4x
# shorter (3 epochs, 45 BSP rounds, 2.5 s of ASP training), so one step more or fewer at the
# budget's end is ~2% of the wall time and a scheduling stall on this shared 2-core machine
# (up to 70 ms seen) ~3%. On such runs the replay has stayed within 0.5%; 15% is the issue's
# criterion and leaves room for a busy machine without hiding a broken model (dropping the
# coordinator round trip alone costs ASP 40% of its wait fraction).
TOL = 0.15


def live_run(root: Path, sync: str) -> Path:
    """A small live run of `sync` (3 workers, worker 1 three times slower, 3 epochs); its run
    folder. No evaluator: the replay reads steps and the coordinator's log, never an
    evaluation. Each replay starts only its own run: the BSP one is slow, so the default suite
    starts the ASP run alone (the two side by side took 11 s of its time, one alone ~6 s)."""
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "train", "--sync", sync, "--workers", "3",
         "--epochs", "3", "--device-time", "1ms", "--straggler", "1:3", "--eval-interval", "0",
         "--out", str(root / sync), "--quiet"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{sync}: {proc.stderr[-2000:]}"
    return root / sync


@pytest.fixture(scope="module")
def bsp_replay(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    return replay(live_run(root, "bsp"), root / "bsp-sim")


@pytest.fixture(scope="module")
def asp_replay(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    return replay(live_run(root, "asp"), root / "asp-sim")


def assert_timing_within(r):
    for key, err in r["error"].items():
        assert abs(err) <= TOL, (key, r["live"][key], r["sim"][key])


@pytest.mark.slow  # fast twins: the live ASP replay, and replays of recorded logs above
def test_live_bsp_replayed_makes_the_same_rounds_in_the_same_time(bsp_replay):
    r = bsp_replay
    assert r["log_check"] == {"live": [], "sim": []}  # the re-run is the coordinator's log
    d = r["decisions"]
    assert d["rounds_live"] == d["rounds_sim"] == d["rounds_same"]
    assert d["steps_live"] == d["steps_sim"] and len(set(d["steps_live"])) == 1
    # One release per round is immediate (the round's last push), the others held. Which
    # worker is last is not a decision: a fast worker stalled by the OS can outlast the slow one.
    assert d["held_live"] == d["held_sim"] == 3 + 2 * d["rounds_live"]  # joins + 2 a round
    assert_timing_within(r)


def test_live_asp_replayed_never_holds_anyone_and_keeps_the_step_counts(asp_replay):
    r = asp_replay
    assert r["log_check"] == {"live": [], "sim": []}
    d = r["decisions"]
    assert d["held_live"] == d["held_sim"] == 3  # only the first releases, at the joins
    # The budget ends mid-flight: which clock crosses it is a race, so a worker may finish
    # one step more or fewer and its last release may say stop in one run and not the other.
    assert d["steps_max_diff"] <= 1 and d["held_agreement"] == 1.0
    assert d["trigger_agreement"] >= 1 - 2 * len(d["steps_live"]) / d["releases_live"]
    assert d["steps_live"][1] < min(d["steps_live"][0], d["steps_live"][2])  # the slow one
    assert_timing_within(r)
    assert not math.isnan(r["error"]["wait_fraction"])
