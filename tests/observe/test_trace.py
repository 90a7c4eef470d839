"""`paramserver trace RUN`: the Chrome trace of a run folder, checked against the Trace Event
Format (the validator below follows its spec: required keys per phase type, numeric ts/dur, ph
in the format's set), on a run folder the test writes and (slow) on a real short run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from paramserver.cli.main import main
from paramserver.observe.core.trace import (
    TraceError, TraceOptions, build_trace, parse_steps,
)

# Every phase type of the Trace Event Format and the keys each event of it must carry
# (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).
PHASE_KEYS = {
    "B": ("name", "ts", "pid", "tid"), "E": ("ts", "pid", "tid"),
    "X": ("name", "ts", "dur", "pid", "tid"),
    "i": ("name", "ts", "pid", "tid"), "I": ("name", "ts", "pid", "tid"),
    "C": ("name", "ts", "pid", "args"),
    "b": ("name", "ts", "pid", "id", "cat"), "n": ("name", "ts", "pid", "id", "cat"),
    "e": ("name", "ts", "pid", "id", "cat"),
    "s": ("name", "ts", "pid", "id"), "t": ("name", "ts", "pid", "id"),
    "f": ("name", "ts", "pid", "id"),
    "P": ("name", "ts", "pid", "tid"),
    "N": ("name", "ts", "pid", "id"), "O": ("name", "ts", "pid", "id"),
    "D": ("name", "ts", "pid", "id"),
    "M": ("name", "pid", "args"),
    "V": ("name", "pid"), "v": ("name", "pid"), "R": ("name", "ts", "pid"),
    "c": ("name", "ts", "pid"), "(": ("ts", "pid"), ")": ("ts", "pid"),
}
METADATA_NAMES = {"process_name": "name", "thread_name": "name", "process_labels": "labels",
                  "process_sort_index": "sort_index", "thread_sort_index": "sort_index"}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate(trace) -> list[dict]:
    """Raise AssertionError where `trace` breaks the Trace Event Format; its events."""
    assert isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list)
    assert trace.get("displayTimeUnit", "ms") in ("ms", "ns")
    for e in trace["traceEvents"]:
        assert isinstance(e, dict), e
        ph = e.get("ph")
        assert ph in PHASE_KEYS, f"ph {ph!r} is not a phase of the format: {e}"
        missing = [k for k in PHASE_KEYS[ph] if k not in e]
        assert not missing, f"{ph} event without {missing}: {e}"
        if "ts" in e:
            assert _number(e["ts"]) and e["ts"] >= 0, e
        if "dur" in e:
            assert _number(e["dur"]) and e["dur"] >= 0, e
        for key in ("pid", "tid"):
            if key in e:
                assert isinstance(e[key], (int, str)) and not isinstance(e[key], bool), e
        if "name" in e:
            assert isinstance(e["name"], str) and e["name"], e
        if "args" in e:
            assert isinstance(e["args"], dict), e
        if ph in ("i", "I") and "s" in e:
            assert e["s"] in ("g", "p", "t"), e
        if ph == "C":
            assert e["args"] and all(_number(v) for v in e["args"].values()), e
        if ph == "M":
            assert e["name"] in METADATA_NAMES, e
            assert METADATA_NAMES[e["name"]] in e["args"], e
    json.dumps(trace, allow_nan=False)  # what a JSON reader takes
    return trace["traceEvents"]


def _no_overlap(events: list[dict]) -> None:
    tracks: dict = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-3, (end, start)


def write_run(folder: Path, workers: int = 3, steps: int = 20, shards: int = 2) -> Path:
    """A run folder as a job writes it: step records (worker 2 without data_s, as a user
    script's), heartbeats' server/shard records, and events with membership, a checkpoint, a
    pause and a stall."""
    folder.mkdir(parents=True)
    barrier = 5.0
    events = [{"t": 0.001, "event": "start", "policy": "bsp"}]
    events += [{"t": 1.0 + s / 10, "event": "server_joined", "rank": s} for s in range(shards)]
    events += [{"t": 2.0 + w / 10, "event": "worker_registered", "rank": w, "src": f"w{w}"}
               for w in range(workers)]
    events.append({"t": barrier, "event": "barrier_open", "workers": workers})
    metrics = []
    for step in range(steps):
        for w in range(workers):
            t = 0.1 * (step + 1) + 0.001 * w
            rec = {"t": round(t, 6), "kind": "step", "worker": w, "step": step, "batch": 32,
                   "loss": 2.0, "compute_s": 0.03, "real_compute_s": 0.03, "wait_s": 0.02,
                   "pull_s": 0.01, "push_s": 0.015, "pull_bytes": 4000, "push_bytes": 4000,
                   "staleness": 0}
            if w != 2:
                rec["data_s"] = 0.005
            metrics.append(rec)
            events.append({"t": barrier + t, "event": "apply_round", "step": step})
        if step % 5 == 4:
            for s in range(shards):
                metrics.append({"t": 0.1 * step, "kind": "shard", "server": s, "apply_s": 0.01,
                                "applies": 5, "queue": s, "backlog": 2})
                metrics.append({"t": 0.1 * step, "kind": "server", "server": s,
                                "late_pushes": 0, "busy_s": 0.02 * step})
    events += [{"t": barrier + 0.55, "event": "checkpoint", "tag": "000000005"},
               {"t": barrier + 0.8, "event": "pause", "why": "evaluation"},
               {"t": barrier + 0.9, "event": "resume"},
               {"t": barrier + 1.5, "event": "stall", "report": "stall-1.txt"},
               {"t": barrier + 2.1, "event": "worker_left", "rank": 1, "reason": "done"}]
    metrics.append({"t": 2.1, "kind": "left", "worker": 1, "reason": "done"})
    for name, records in (("metrics.jsonl", metrics), ("events.jsonl", events)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records)
                                   + '{"torn": ')  # a torn last line, as after a crash
    return folder


def test_the_trace_of_a_run_folder_is_valid_and_holds_every_workers_phases(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    assert main(["trace", str(run)]) == 0
    assert "open it in" in capsys.readouterr().out
    events = validate(json.loads((run / "trace.json").read_text()))
    phases = [e for e in events if e["ph"] == "X"]
    for w in range(3):
        mine = [e for e in phases if e["tid"] == w + 1]
        names = {e["name"] for e in mine}
        assert names == ({"wait", "pull", "compute", "push"} | ({"data"} if w != 2 else set()))
        assert {e["args"]["step"] for e in mine} == set(range(20))
    _no_overlap(events)
    # The phases end where the record says the clock arrived, and last what it says.
    first = sorted((e for e in phases if e["tid"] == 1 and e["args"]["step"] == 3),
                   key=lambda e: e["ts"])
    assert [e["name"] for e in first] == ["wait", "pull", "data", "compute", "push"]
    # (data_s is part of compute_s: 5 ms of the 30 drew the batch)
    assert [round(e["dur"]) for e in first] == [20000, 10000, 5000, 25000, 15000]
    shift = json.loads((run / "trace.json").read_text())["otherData"]["shift_us"]
    assert first[-1]["ts"] + first[-1]["dur"] - shift == pytest.approx(0.4e6, abs=1)
    named = {(e["args"]["name"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert {("worker 0", 1), ("worker 2", 3), ("shard 1", 2)} <= named
    instants = {e["name"] for e in events if e["ph"] == "i"}
    assert {"checkpoint", "pause", "resume", "stall", "worker_left", "barrier_open",
            "server_joined", "worker_registered"} <= instants
    assert "apply_round" not in instants
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"shard 0 apply_s", "shard 1 queue", "shard 1 applies", "shard 0 busy_s",
            "shard 1 backlog"} <= counters


def test_a_step_window_keeps_those_steps_and_the_events_of_their_time(tmp_path):
    run = write_run(tmp_path / "run")
    out = tmp_path / "w.json"
    assert main(["trace", str(run), "-o", str(out), "--steps", "5:8"]) == 0
    events = validate(json.loads(out.read_text()))
    assert {e["args"]["step"] for e in events if e["ph"] == "X"} == {5, 6, 7}
    instants = {e["name"] for e in events if e["ph"] == "i"}
    assert "checkpoint" in instants and "stall" not in instants
    assert main(["trace", str(run), "--steps", "50:60"]) == 2


def test_beyond_max_events_every_kth_step_is_kept_and_a_note_says_so(tmp_path):
    run = write_run(tmp_path / "run", workers=4, steps=200)
    out = tmp_path / "s.json"
    assert main(["trace", str(run), "-o", str(out), "--max-events", "500"]) == 0
    trace = json.loads(out.read_text())
    events = validate(trace)
    assert len(events) <= 500
    note = [e for e in events if e["name"] == "trace sampled"]
    assert len(note) == 1 and note[0]["args"]["kept_every_step"] > 1
    assert note[0]["args"]["dropped_phase_events"] > 0
    kept = {(e["tid"], e["args"]["step"]) for e in events if e["ph"] == "X"}
    steps = {s for _, s in kept}
    assert {(w + 1, s) for w in range(4) for s in steps} == kept  # same steps, every worker


def test_records_without_optional_fields_and_bad_input():
    # A step record with only the fields of an older run, no events file, no shard records.
    trace = build_trace([{"t": 1.0, "kind": "step", "worker": 0, "step": 0, "wait_s": 0.5,
                          "compute_s": 0.25},
                         {"t": "x", "kind": "step", "worker": 0, "step": 1},  # unreadable
                         {"kind": "eval", "accuracy": 0.5}], [])
    events = validate(trace)
    assert [(e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X"] == [
        ("wait", 250000.0, 500000.0), ("compute", 750000.0, 250000.0)]
    with pytest.raises(TraceError):
        TraceOptions(max_events=5)
    for bad in ("5", "a:b", "8:3", "-1:4"):
        with pytest.raises(ValueError):
            parse_steps(bad)
    assert parse_steps("3:") == (3, None) and parse_steps(":7") == (None, 7)


def test_no_run_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["trace", str(tmp_path)]) == 2
    assert "no run folder" in capsys.readouterr().err


def test_the_out_file_is_checked_at_the_flag_and_its_folder_made(tmp_path, capsys):
    """-o into a folder not there yet makes it; a folder, or a path under a file, is refused as
    the flag's error (open() raised a traceback for all three)."""
    run = write_run(tmp_path / "run")
    assert main(["trace", str(run), "-o", str(tmp_path / "new" / "t.json")]) == 0
    validate(json.loads((tmp_path / "new" / "t.json").read_text()))
    (tmp_path / "notes.txt").write_text("a file\n")
    for out, says in ((tmp_path, f"{tmp_path} is a folder; give the name of a file to write"),
                      (tmp_path / "notes.txt" / "t.json", "notes.txt is a file, not a folder")):
        with pytest.raises(SystemExit) as refused:
            main(["trace", str(run), "-o", str(out)])
        err = capsys.readouterr().err
        assert refused.value.code == 2 and says in err.splitlines()[0], err
        assert "Traceback" not in err


@pytest.mark.slow
def test_the_trace_of_a_real_run_holds_every_workers_phases(tmp_path):
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "paramserver", "train", "--workers", "3",
                           "--servers", "2", "--steps", "12", "--eval-interval", "0",
                           "--sync", "bsp", "--out", str(run), "--quiet"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    out = subprocess.run([sys.executable, "-m", "paramserver", "trace", str(run)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    events = validate(json.loads((run / "trace.json").read_text()))
    _no_overlap(events)
    for w in range(3):
        mine = [e for e in events if e["ph"] == "X" and e["tid"] == w + 1]
        assert {"wait", "pull", "compute", "push"} <= {e["name"] for e in mine}
        assert {e["args"]["step"] for e in mine} == set(range(12))
    assert "barrier_open" in {e["name"] for e in events if e["ph"] == "i"}
