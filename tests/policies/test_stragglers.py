"""Straggler specs (grammar, errors, factors, trace replay) and emulated device time top-ups."""

import argparse

import pytest

from paramserver.emulation.device_time import ComputeShare, DeviceTime, parse_device_time
from paramserver.emulation.stragglers import STRAGGLER_HELP, StragglerSpecError, parse_straggler, parse_trace
from paramserver.emulation.trace_io import read_trace


def factors(model, workers=range(4), step=0, t=0.0):
    return [model.factor(w, step, t) for w in workers]


def test_none_and_static():
    assert factors(parse_straggler("none")) == [1.0] * 4
    assert factors(parse_straggler(None)) == [1.0] * 4
    assert factors(parse_straggler("1:3")) == [1, 3, 1, 1]
    m = parse_straggler(" 1:3, 2:1.5 ")
    assert factors(m) == [1, 3, 1.5, 1] and factors(m, step=99, t=1e6) == [1, 3, 1.5, 1]
    assert m.workers() == {1, 2}


def test_random_is_deterministic_with_the_right_rate():
    m = parse_straggler("random:0.1:4", seed=7)
    draws = [m.factor(w, s, 0.0) for w in range(4) for s in range(5000)]
    assert set(draws) == {1.0, 4.0}
    assert 0.09 < draws.count(4.0) / len(draws) < 0.11
    again = parse_straggler("random:0.1:4", seed=7)
    assert draws == [again.factor(w, s, 123.0) for w in range(4) for s in range(5000)]
    other = parse_straggler("random:0.1:4", seed=8)
    assert draws != [other.factor(w, s, 0.0) for w in range(4) for s in range(5000)]
    assert factors(parse_straggler("random:0:4")) == [1.0] * 4
    assert factors(parse_straggler("random:1:4")) == [4.0] * 4


def test_schedule_intervals_are_half_open_with_gaps_at_1x():
    m = parse_straggler("schedule:1:0-30=3,40-60=1.5;2:10-=2")
    at = lambda w, t: m.factor(w, 0, t)  # noqa: E731
    assert [at(1, t) for t in (0, 29.9, 30, 35, 40, 59, 60, 1e9)] == [3, 3, 1, 1, 1.5, 1.5, 1, 1]
    assert [at(2, t) for t in (0, 9.99, 10, 1e9)] == [1, 1, 2, 2]
    assert at(0, 20) == 1 and m.workers() == {1, 2}


def test_terms_multiply():
    m = parse_straggler("1:3+schedule:1:5-10=2")
    assert m.factor(1, 0, 0) == 3 and m.factor(1, 0, 7) == 6 and m.factor(0, 0, 7) == 1


def test_trace_replay_from_file(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("time_s,worker,factor,note\n10,1,3,x\n0,1,1.5,\n20,1,1,\n5,0,2,\n5,0,4,later\n")
    m = parse_straggler(f"trace:{path}", read_trace=read_trace)
    assert [m.factor(1, 0, t) for t in (0, 9, 10, 19.5, 20, 100)] == [1.5, 1.5, 3, 3, 1, 1]
    assert [m.factor(0, 0, t) for t in (4.9, 5, 50)] == [1, 4, 4]  # later duplicate row wins
    assert m.factor(3, 0, 10) == 1 and m.workers() == {0, 1}


@pytest.mark.parametrize("text, words", [
    ("t,worker,factor\n1,0,2\n", "missing time_s"),
    ("time_s,worker,factor\n", "no rows"),
    ("time_s,worker,factor\n1,0,2\n2,zero,2\n", r"trace.csv:3: expected numbers"),
    ("time_s,worker,factor\n1,0,0\n", r"trace.csv:2: need"),
    ("time_s,worker,factor\n-1,0,2\n", "need time_s >= 0"),
])
def test_trace_errors_name_the_line(text, words):
    with pytest.raises(StragglerSpecError, match=words):
        parse_trace(text, source="trace.csv")


@pytest.mark.parametrize("spec, words", [
    ("slow", "not one of none"),
    ("1", "WORKER:FACTOR pairs"),
    ("1:", "factor of worker 1 must be a number > 0"),
    ("1:0", "must be a number > 0"),
    ("1:-2", "must be a number > 0"),
    ("1:3,1:2", "worker 1 given twice"),
    ("1:3,2", "WORKER:FACTOR pairs"),
    ("x:3", "not one of"),
    ("random:0.1", "random:PROB:FACTOR"),
    ("random:1.5:4", r"probability must be in \[0, 1\]"),
    ("random:nan:4", "probability must be a number"),
    ("schedule:1:0-30", "START-END=FACTOR"),
    ("schedule:1:30-10=2", "empty interval"),
    ("schedule:1:0-30=3,20-40=2", "overlap at t=20"),
    ("schedule:1:0-1=2;1:5-6=2", "scheduled twice"),
    ("schedule:0-30=3", "schedule:WORKER:START-END=FACTOR"),
    ("schedule:a:0-1=2", "worker must be a rank"),
    ("trace:", "trace:FILE.csv"),
    ("trace:/no/such/file.csv", "cannot read trace"),
    ("1:3+", "empty term"),
])
def test_bad_specs_say_what_was_expected(spec, words):
    with pytest.raises(StragglerSpecError, match=words) as err:
        parse_straggler(spec, read_trace=read_trace)
    assert repr(spec) in str(err.value)


def test_the_pure_parser_reads_no_file_without_a_reader(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("time_s,worker,factor\n0,1,3\n")
    lazy = parse_straggler(f"1:2+trace:{path}")  # no reader: the file is not opened
    assert f"trace:{path}" in lazy.spec
    with pytest.raises(StragglerSpecError, match="without reading its file"):
        lazy.factor(1, 0, 0.0)
    assert parse_straggler(f"1:2+trace:{path}", read_trace=read_trace).factor(1, 0, 0.0) == 6


def test_worker_ranks_are_checked_against_the_job():
    parse_straggler("1:3,2:2").check_workers(3)
    with pytest.raises(StragglerSpecError, match=r"worker\(s\) \[3\]"):
        parse_straggler("1:3+schedule:3:0-1=2").check_workers(3)


def test_argparse_shows_our_message(capsys):
    parser = argparse.ArgumentParser(formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--straggler", type=parse_straggler, help=STRAGGLER_HELP)
    assert parser.parse_args(["--straggler", "0:2"]).straggler.factor(0, 0, 0) == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["--straggler", "1:x"])
    assert "factor of worker 1 must be a number > 0" in capsys.readouterr().err


# --- device time ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, cost", [
    ("2ms", 2e-3), ("0.5ms", 5e-4), ("250us", 2.5e-4), ("0.002s", 2e-3), ("2ms/sample", 2e-3),
    ("1e-3s", 1e-3), ("1 ms", 1e-3),
])
def test_device_time_parse(spec, cost):
    assert parse_device_time(spec).cost_per_sample == pytest.approx(cost)


@pytest.mark.parametrize("spec", ["2", "fast", "-1ms", "2 minutes", "ms"])
def test_device_time_errors(spec):
    with pytest.raises(StragglerSpecError, match="expected 'off' or a time per sample"):
        parse_device_time(spec)
    with pytest.raises(StragglerSpecError, match="must be > 0"):
        parse_device_time("0ms")


def test_device_time_top_up():
    dev = parse_device_time("2ms")
    assert dev.enabled and dev.step_time(32, 1.0) == pytest.approx(0.064)
    assert dev.step_time(32, 3.0) == pytest.approx(0.192)
    top = dev.top_up(32, 3.0, real_seconds=0.012)
    assert top.sleep == pytest.approx(0.180) and top.real_share == pytest.approx(0.0625)
    over = dev.top_up(4, 1.0, real_seconds=0.05)  # real compute exceeded the model
    assert over.sleep == 0 and over.overrun and over.real_share == 1.0


def test_device_time_off_scales_real_compute():
    dev = parse_device_time("off")
    assert not dev.enabled and dev.describe() == "off" and parse_device_time(None) == dev
    top = dev.top_up(32, 3.0, real_seconds=0.01)
    assert top.sleep == pytest.approx(0.02) and top.real_share == pytest.approx(1 / 3)
    assert dev.top_up(32, 0.5, real_seconds=0.01).sleep == 0  # cannot speed real compute up
    with pytest.raises(ValueError, match="off"):
        dev.step_time(32)


def test_compute_share_accumulates():
    share, dev = ComputeShare(), DeviceTime(1e-3)
    share.add(dev.top_up(10, 1.0, 0.002))   # 2 ms real + 8 ms sleep
    share.add(dev.top_up(10, 1.0, 0.012))   # overrun: 12 ms real, no sleep
    summary = share.summary()
    assert summary["steps"] == 2 and summary["overrun_steps"] == 1
    assert summary["real_compute_share"] == pytest.approx(14 / 22)
