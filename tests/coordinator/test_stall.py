"""The hang doctor's fast tests: the stall detector and the report builder on the pure core (no
sockets), the flight recorder and the probe answer it makes, the wire ops, the job field and
`paramserver doctor` on written reports. The live checks (a SIGSTOPped worker under BSP and
ASP) are tests/coordinator/test_stall_live.py, marked slow."""

import threading

import pytest

from paramserver.cli.main import main
from paramserver.observe.flight import FlightRecorder, probe_answer
from paramserver.observe.core.stall import (
    HANG, MISSING, MemberView, ProbeAnswer, ReportInput, StallDetector, StallSettings,
    build_report, describe_wait, missing_workers,
)
from paramserver.spec.job import JobSpec, JobSpecError, Limits
from paramserver.wire import Message, WireError
from paramserver.wire.codec import MAX_HEADER_BYTES, decode, encode

W = ("w0", "w1", "w2")


def _stepping(d: StallDetector, t0: float, t1: float, dt: float, workers=W) -> float:
    """Every worker clocks and is released every `dt` from t0 to t1; returns the last time."""
    t = t0
    while t < t1:
        for w in workers:
            d.clocked(w, t)
            d.released(t)
        t += dt
    return t - dt


# ---- the detector -------------------------------------------------------------------------------
def test_the_timeout_is_derived_from_the_median_step_time_with_a_floor():
    d = StallDetector(StallSettings(factor=10, floor=3.0), 0.0)
    assert d.timeout() == 30.0  # no step yet: a first step may take long (a big model's)
    _stepping(d, 0.0, 5.0, 0.1)
    assert d.median_step() == pytest.approx(0.1)
    assert d.timeout() == 3.0  # 10 x 0.1 s is under the floor
    _stepping(d, 5.0, 200.0, 1.0)
    assert d.timeout() == pytest.approx(10.0)
    assert StallDetector(StallSettings(timeout=2.5), 0.0).timeout() == 2.5


def test_a_long_first_step_is_no_hang_and_sets_the_timeout_once_it_ends():
    """A job whose steps outlast the floor (a 10^8-parameter model, a long device time) got
    a hang report during its first step, while every worker was inside it."""
    d = StallDetector(StallSettings(factor=10, floor=3.0), 0.0)
    d.released(1.0)  # the barrier opens: every worker starts step 0
    assert d.check(1.2, W) is None  # the first look: each worker awaited from here
    assert d.check(25.0, W) is None  # 24 s into the first step: not yet
    d.clocked("w0", 26.0)  # its first step took about 25 s
    assert d.median_step() == pytest.approx(24.8) and d.timeout() == pytest.approx(248.0)
    assert d.check(60.0, W) is None
    stuck = StallDetector(StallSettings(factor=10, floor=3.0), 0.0)
    stuck.released(1.0)
    assert stuck.check(1.2, W) is None
    stall = stuck.check(31.5, W)  # no step within 10 x the floor: a hang all the same
    assert stall.kind == HANG and stall.timeout_s == pytest.approx(30.0)


def test_no_step_for_the_timeout_is_a_hang_told_once_until_steps_complete_again():
    d = StallDetector(StallSettings(timeout=2.0), 0.0)
    last = _stepping(d, 0.0, 1.0, 0.1)
    d.clocked("w0", last + 0.5)  # two clocks of the stuck round come, no release
    d.clocked("w2", last + 0.5)
    assert d.check(last + 1.9, W) is None
    stall = d.check(last + 2.1, W)
    assert stall.kind == HANG and stall.idle_s == pytest.approx(2.1) and stall.given
    assert stall.late == ("w1",)  # the one whose clock is older than the timeout
    assert d.check(last + 5.0, W) is None  # told once
    d.released(last + 6.0)  # the round completed (SIGCONT): a later stall is a new one
    for w in W:
        d.clocked(w, last + 6.0)
    assert d.check(last + 7.0, W) is None
    assert d.check(last + 8.5, W).kind == HANG


def test_one_worker_silent_while_the_others_step_is_missing_not_a_hang():
    d = StallDetector(StallSettings(timeout=2.0), 0.0)
    _stepping(d, 0.0, 1.0, 0.1)
    last = _stepping(d, 1.0, 4.0, 0.1, workers=("w0", "w2"))  # w1 stopped at t=1
    stall = d.check(last, W)
    assert stall.kind == MISSING and stall.late == ("w1",) and stall.idle_s > 2.0
    assert d.check(last + 0.05, W) is None  # told once
    d.clocked("w1", last + 0.1)  # back: it may go missing again later
    _stepping(d, last + 0.1, last + 4.0, 0.1, workers=("w0", "w2"))
    assert d.check(last + 4.0, W).late == ("w1",)


def test_a_worker_first_seen_is_awaited_from_then_and_one_gone_is_forgotten():
    d = StallDetector(StallSettings(timeout=2.0), 0.0)
    last = _stepping(d, 0.0, 10.0, 0.1, workers=("w0",))
    assert d.check(last, ("w0", "w9")) is None  # w9 just started: its clock starts now
    last = _stepping(d, last, last + 1.5, 0.1, workers=("w0",))
    assert d.check(last, ("w0", "w9")) is None
    last = _stepping(d, last, last + 1.0, 0.1, workers=("w0",))
    assert d.check(last, ("w0", "w9")).late == ("w9",)
    assert d.since_clock("w9", last) is not None
    d.check(last, ("w0",))  # w9 left (or was declared dead)
    assert d.since_clock("w9", last) is None


def test_a_pause_stops_the_clock_and_is_announced_and_the_timeout_runs_again_after_it():
    d = StallDetector(StallSettings(timeout=2.0), 0.0)
    last = _stepping(d, 0.0, 1.0, 0.1)
    assert d.paused(["checkpoint"], last + 0.5) == [("pause", "checkpoint")]
    assert d.paused(["checkpoint"], last + 1.0) == []  # in force: nothing new to announce
    assert d.check(last + 30.0, W) is None  # a long checkpoint is no hang
    assert d.paused(["checkpoint", "policy_wait"], last + 31) == [("pause", "policy_wait")]
    assert d.paused([], last + 40.0) == [("resume", "checkpoint"), ("resume", "policy_wait")]
    assert d.check(last + 41.9, W) is None  # the full timeout from the resume
    assert d.check(last + 42.1, W).kind == HANG


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="stall timeout"):
        StallSettings(timeout=0)
    with pytest.raises(ValueError):
        StallSettings(floor=-1)


# ---- the report ---------------------------------------------------------------------------------
def _bsp_hang_input(**changes) -> ReportInput:
    members = (
        MemberView("w-1", "worker", 0, 0.3, step=42, held=True, clock_s=3.1),
        MemberView("w-2", "worker", 1, 3.3, step=41, held=False, clock_s=3.3),
        MemberView("w-3", "worker", 2, 0.2, step=42, held=True, clock_s=3.0),
        MemberView("s0", "server", 0, 0.5, addr="tcp://127.0.0.1:5000"),
        MemberView("ev", "observer", 0, 0.1),
    )
    answers = {
        "w-1": ProbeAnswer("w-1", "worker", "Thread 0x1 (most recent call first):\n  File "
                           "\"kv.py\", line 9 in clock\n", ("-0.1s send op=clock step=41",),
                           {"op": "release", "step": 42, "peer": "coordinator", "for_s": 3.1},
                           0.4),
        "w-3": ProbeAnswer("w-3", "worker", "Thread 0x3:\n  File \"x.py\", line 1 in f\n",
                           (), {"op": "push", "peer": "server 0", "range": [0, 100],
                                "step": 42}, 0.5),
        "s0": ProbeAnswer("s0", "server", "Thread 0x5:\n", ("-0.2s recv op=push",),
                          {"op": "serve", "note": "version 41, 2 pull(s) waiting"}, 0.2),
        "ev": ProbeAnswer("ev", "observer", "Thread 0x7:\n", (), None, 0.3),
    }
    fields = dict(n=3, stall=StallDetector(StallSettings(timeout=2.0), 0.0).check(5.0, ()),
                  t=5.0, wall="2026-01-01 00:00:00 UTC", policy="bsp", progress=41,
                  members=members, answers=answers,
                  coordinator=ProbeAnswer("coordinator", "coordinator", "Thread 0x9:\n",
                                          ("-0.0s send op=release step=41",)),
                  probe_wait_s=1.5)
    fields.update(changes)
    return ReportInput(**fields)


def test_a_bsp_hang_report_names_the_silent_worker_the_step_and_what_the_others_wait_for():
    text = build_report(_bsp_hang_input())
    lines = text.splitlines()
    assert lines[0] == "paramserver stall report 3"
    assert lines[2].startswith("HANG: no step completed for 5.00 s (stall timeout 2.00 s, given")
    missing = [line for line in lines if line.startswith("missing:")]
    assert missing == ["missing: worker rank 1 (w-2): in step 41, owes its clock of step 41; "
                       "last clock 3.30 s ago, last heard 3.30 s ago; did not answer the probe"]
    assert ("waiting: 2 worker(s) (rank 0, rank 2) clocked step 41 and wait for the release "
            "(op clock -> release, from the coordinator); the round waits on rank 1") in text
    assert "not answering the probe (waited up to 1.50 s): worker rank 1 (w-2" in text
    assert "waits for: release, step 42, from coordinator, for 3.10 s" in text
    assert "waits for: push, step 42, keys [0, 100), from server 0" in text
    assert "waits for: nothing: serving (version 41, 2 pull(s) waiting)" in text
    # a section per member and the coordinator, each answer's stack and flight lines in it
    sections = [line for line in lines if line.startswith("--- ")]
    assert sections == ["--- coordinator ---", "--- worker rank 0 (w-1) ---",
                        "--- worker rank 1 (w-2) ---", "--- worker rank 2 (w-3) ---",
                        "--- server rank 0 (s0) ---", "--- observer rank 0 (ev) ---"]
    assert text.count("stack (faulthandler, every thread):") == 5
    assert "line 9 in clock" in text and "-0.1s send op=clock step=41" in text
    assert "(no answer: stopped" in text.split("--- worker rank 1 (w-2) ---")[1]


def test_a_missing_report_is_no_hang_and_names_only_the_late_worker():
    stall = StallDetector(StallSettings(timeout=2.0), 0.0)
    stall.check(0.0, ("w-1", "w-2"))
    stall.clocked("w-1", 2.5)
    stall.released(2.5)
    found = stall.check(2.6, ("w-1", "w-2"))
    assert found.kind == MISSING and found.late == ("w-2",)
    r = _bsp_hang_input(stall=found, answers={})
    text = build_report(r)
    assert "MISSING WORKER (not a hang" in text and "HANG" not in text
    assert [m.rank for m in missing_workers(found, r.members)] == [1]
    assert "waiting:" not in text


def test_a_hang_with_no_clock_held_says_the_workers_are_inside_their_steps():
    stall = StallDetector(StallSettings(timeout=1.0), 0.0).check(2.0, ())
    members = (MemberView("w-1", "worker", 0, 0.1, step=5, held=False, clock_s=2.0),)
    text = build_report(_bsp_hang_input(stall=stall, members=members, answers={}))
    assert "no worker's clock is held" in text
    assert describe_wait(None) == "nothing (not blocked in a request)"


# ---- the flight recorder and the probe answer ---------------------------------------------------
def test_the_flight_recorder_is_bounded_and_formats_only_when_read():
    now = [0]
    f = FlightRecorder(capacity=4, clock=lambda: now[0])
    for i in range(10):
        now[0] = i * 1_000_000_000
        f.record("send", op="push", rid=i, step=None, x=0.1234567891)
    assert len(f) == 4
    lines = f.lines()
    assert lines[0] == "-   3.000s send op=push rid=6 step=None x=0.123457"
    assert lines[-1].startswith("-   0.000s send op=push rid=9")
    assert f.lines(2) == lines[-2:] and f.lines(0) == []
    f.record("recv", note="y" * 500)
    assert len(f.lines()[-1]) <= 200


def test_a_probe_answer_holds_every_threads_stack_and_what_it_waits_for_and_crosses_the_wire():
    f = FlightRecorder()
    for i in range(400):
        f.record("send", op="push", shard=1, rid=i, blob="z" * 300)
    f.waiting = lambda: {"op": "push", "peer": "server 1", "range": (10, 20), "x": object()}
    gate = threading.Event()

    def parked_in_a_named_function():
        gate.wait(10)
    t = threading.Thread(target=parked_in_a_named_function)
    t.start()
    try:
        fields = probe_answer(7, "worker", f)
    finally:
        gate.set()
        t.join(5)
    assert "parked_in_a_named_function" in fields["stack"]
    assert "test_a_probe_answer_holds" in fields["stack"]  # this thread too
    assert fields["waiting"]["range"] == [10, 20] and isinstance(fields["waiting"]["x"], str)
    frames = encode(Message("stall_answer", fields, src="w-1"))
    assert len(frames[0]) < MAX_HEADER_BYTES  # fits the coordinator's header bound
    back = decode(frames)
    assert back.op == "stall_answer" and back["n"] == 7 and len(back["flight"]) == 64


def test_a_waiting_description_that_fails_is_reported_not_raised():
    f = FlightRecorder()
    f.waiting = lambda: {}["nope"]
    assert f.waiting_for()["op"] == "?"
    f.waiting = None
    assert f.waiting_for() is None


def test_the_stall_ops_refuse_bad_fields():
    with pytest.raises(WireError):
        decode(encode(Message("stall_probe", {"n": -1})))
    with pytest.raises(WireError):
        decode(encode(Message("stall_answer", {"n": 1, "role": "worker", "stack": 5})))
    assert decode(encode(Message("stall_probe", {"n": 3})))["n"] == 3


# ---- the job field ------------------------------------------------------------------------------
def test_the_stall_timeout_is_a_job_field_null_in_the_job_file_when_derived():
    assert JobSpec().to_dict()["limits"]["stall_timeout"] is None
    assert JobSpec.from_dict(JobSpec().to_dict()).limits.stall_timeout is None
    job = JobSpec(limits=Limits(stall_timeout=4.0))
    assert job.to_dict()["limits"]["stall_timeout"] == 4.0
    assert JobSpec.from_dict(job.to_dict()).limits.stall_timeout == 4.0
    with pytest.raises(JobSpecError, match="stall_timeout"):
        Limits(stall_timeout=0)


# ---- paramserver doctor -------------------------------------------------------------------------
def test_doctor_prints_the_latest_report_and_lists_the_others(tmp_path, capsys):
    (tmp_path / "stall-1.txt").write_text(build_report(_bsp_hang_input(n=1)))
    found = StallDetector(StallSettings(timeout=2.0), 0.0)
    found.check(0.0, ("w-2",))
    found.released(2.5)
    stall = found.check(2.6, ("w-2",))
    (tmp_path / "stall-10.txt").write_text(build_report(_bsp_hang_input(n=10, stall=stall)))
    (tmp_path / "stall-x.txt").write_text("not a report")
    assert main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 stall report(s)" in out
    assert "   stall-1.txt: HANG: no step completed" in out
    assert " * stall-10.txt: MISSING WORKER" in out  # the latest by number, not by name
    assert "paramserver stall report 10" in out and "--- coordinator ---" in out
    assert main(["doctor", str(tmp_path), "--report", "1", "--brief"]) == 0
    out = capsys.readouterr().out
    assert "paramserver stall report 1" in out and "--- coordinator ---" not in out
    assert "missing: worker rank 1" in out
    assert main(["doctor", str(tmp_path), "--list"]) == 0
    assert "paramserver stall report" not in capsys.readouterr().out
    assert main(["doctor", str(tmp_path), "--report", "5"]) == 2
    assert "has no stall report 5 (it has 1, 10)" in capsys.readouterr().err


def test_doctor_says_clearly_when_there_is_no_folder_or_no_report(tmp_path, capsys):
    assert main(["doctor", str(tmp_path / "nope")]) == 2
    assert "no run folder at" in capsys.readouterr().err
    assert main(["doctor", str(tmp_path)]) == 2  # a folder, but no run's
    assert "is no run folder (no metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "events.jsonl").write_text("")
    assert main(["doctor", str(tmp_path)]) == 1
    assert "no stall reports in" in capsys.readouterr().err
