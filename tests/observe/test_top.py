"""`paramserver top`: one frame of a run folder written here (replayed or followed), the sources'
reading rules, and the read-only observer against a real coordinator."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from paramserver.cli.main import main
from paramserver.observe.source import (
    FolderSource, LineTail, ObserverSource, ReplaySource, SourceError, open_source,
    read_preflight,
)
from ps_helpers import bsp_run


def write_run(run: Path, records: list[dict], finished: bool = True, policy: str = "bsp",
              preflight: dict | None = None) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "job.json").write_text(json.dumps({"version": 1, "sync": {"name": policy}}))
    (run / "events.jsonl").write_text(json.dumps({"t": 0.0, "event": "start",
                                                  "policy": policy}) + "\n")
    with open(run / "metrics.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    if finished:
        (run / "summary.json").write_text("{}")
    if preflight is not None:
        (run / "preflight.json").write_text(json.dumps(preflight))
    return run


PREFLIGHT = {"version": 1, "t": 1.5, "links": [
    {"worker": "worker-0", "shard": 0, "rtt_ms": 0.21, "mbit_s": 9000.0, "bytes": 1 << 20},
    {"worker": "worker-1", "shard": 0, "rtt_ms": 4.5, "mbit_s": 95.0, "bytes": 1 << 20},
    {"worker": "worker-2", "shard": 0, "rtt_ms": "bad"}]}

SHARDS = [{"t": 1.0 + i, "kind": "shard", "server": 0, "apply_s": 0.004, "applies": 2,
           "queue": 1, "backlog": 2} for i in range(3)]


def worker_line(out: str, rank: int) -> str:
    return next(line for line in out.splitlines() if line.strip("│ ").startswith(f"{rank} "))


def test_once_replay_draws_the_end_of_a_run(tmp_path, capsys):
    records = bsp_run(30, {1: lambda k: 3.0}) + SHARDS
    run = write_run(tmp_path / "run", sorted(records, key=lambda r: r["t"]),
                    preflight=PREFLIGHT)
    assert main(["top", str(run), "--once", "--replay", "--width", "170"]) == 0
    out = capsys.readouterr().out
    assert "policy bsp (round mode)" in out and "finished" in out
    assert "steps 120" in out
    assert "chronic" in worker_line(out, 1)
    for rank in (0, 2, 3):
        assert "ok" in worker_line(out, rank)
    # the others lost about 3 x 1 s per round waiting for worker 1: 30 rounds
    lost = float(worker_line(out, 1).split()[-2])
    assert 80 < lost < 110
    assert "worker 1 step" in out and "-> chronic" in out  # the flags line
    assert "apply ms/update" in out and "2.00" in out  # 4 ms over 2 applies
    assert "preflight" in out and "4.50 / 95" in out and "worker-2" not in out
    for phase in ("data", "compute", "push", "wait", "pull", "median"):
        assert phase in out


def test_once_on_a_live_folder_and_the_observer_header(tmp_path, capsys):
    run = write_run(tmp_path / "run", bsp_run(5, {}), finished=False, policy="asp")
    assert main(["top", str(run), "--once", "--width", "150"]) == 0
    out = capsys.readouterr().out
    assert "(live)" in out and "arrival mode" in out and "running" in out


def test_bad_targets_are_refused_with_a_clear_error(tmp_path, capsys):
    assert main(["top", str(tmp_path / "nowhere"), "--once"]) == 2
    assert "no such run folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["top", str(tmp_path / "empty"), "--once"]) == 2
    assert "no run folder" in capsys.readouterr().err
    assert main(["top", "tcp://127.0.0.1:9", "--replay", "--once"]) == 2
    assert "--replay needs a run folder" in capsys.readouterr().err
    run = write_run(tmp_path / "run", [])
    assert main(["top", str(run), "--replay", "--speed", "-1", "--once"]) == 2


def test_line_tail_waits_for_whole_lines_and_skips_garbage(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"b": ')
    tail = LineTail(path)
    assert tail.read() == [{"a": 1}]
    with open(path, "a") as f:
        f.write('2}\n[3]\n')
    assert tail.read() == [{"b": 2}]
    assert tail.read() == []
    path.write_text('{"c": 3}\n')  # rewritten shorter: read from the start
    assert tail.read() == [{"c": 3}]


def test_folder_source_is_finished_once_the_summary_is_there_and_all_is_read(tmp_path):
    run = write_run(tmp_path / "run", bsp_run(2, {}), finished=False)
    src = FolderSource(run)
    assert len(src.poll(0.0)) == 8 and not src.finished
    (run / "summary.json").write_text("{}")
    assert src.poll(1.0) == [] and src.finished


def test_a_finished_folder_read_in_one_poll_is_finished_and_one_read_in_chunks_is_not(
        tmp_path, capsys):
    """`top --once` on a finished run polls once: it read every record and said 'running'."""
    run = write_run(tmp_path / "run", bsp_run(2, {}))
    src = FolderSource(run)
    assert len(src.poll(0.0)) == 8 and src.finished
    assert main(["top", str(run), "--once", "--width", "150"]) == 0
    assert "finished" in capsys.readouterr().out
    tail = LineTail(run / "metrics.jsonl")  # a big file: read a chunk a poll
    got, reads = [], 0
    while True:
        got += tail.read(limit=200)
        reads += 1
        if tail.at_end:
            break
        assert reads < 100
    assert len(got) == 8 and reads > 2


@pytest.mark.parametrize("width", [80, 110, 170])
def test_the_workers_table_sheds_columns_to_fit_the_terminal(tmp_path, capsys, width):
    """At 80 columns every one of the 17 columns was squeezed to an ellipsis."""
    run = write_run(tmp_path / "run", bsp_run(30, {1: lambda k: 3.0}))
    assert main(["top", str(run), "--once", "--replay", "--width", str(width)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("worker "):out.index("split: ")]
    assert all(len(line) <= width for line in out.splitlines())
    assert "…" not in table, table
    header = table.splitlines()[0].split()
    assert header[:3] == ["worker", "step", "samples/s"] and "split" in header
    assert ("compute" in header) == (width >= 140) and ("batch" in header) == (width >= 100)
    assert "chronic" in worker_line(out, 1)


def test_replay_paces_records_by_the_speed_factor(tmp_path):
    records = [{"t": float(t), "kind": "step", "worker": 0, "step": t} for t in range(10)]
    run = write_run(tmp_path / "run", records[::-1])  # out of order in the file: sorted
    src = ReplaySource(run, speed=2.0)
    assert [r["step"] for r in src.poll(1.0)] == [0, 1, 2]
    assert [r["step"] for r in src.poll(2.0)] == [3, 4]
    assert not src.finished
    assert len(src.poll(100.0)) == 5 and src.finished
    assert len(ReplaySource(run, speed=0).poll(0.0)) == 10


def test_auto_shows_the_candidate_in_force(tmp_path, capsys):
    """Under --sync auto the header names the candidate in force: now when following the
    folder, at the replayed time in a replay (events count from the coordinator's start,
    the records from the barrier's opening)."""
    records = [{"t": float(t), "kind": "step", "worker": 0, "step": t, "batch": 32}
               for t in range(10)]
    run = write_run(tmp_path / "run", records, finished=False, policy="auto")
    with open(run / "events.jsonl", "a") as f:
        for e in ({"t": 0.5, "event": "barrier_open"},
                  {"t": 0.5, "event": "sync_switch", "from": None, "to": "bsp"},
                  {"t": 4.5, "event": "sync_switch", "from": "bsp", "to": "lbbsp"}):
            f.write(json.dumps(e) + "\n")
    follow = FolderSource(run)
    follow.poll(0.0)
    assert follow.label == "auto: lbbsp in force"
    replay = ReplaySource(run, speed=1.0)
    replay.poll(2.0)
    assert replay.label == "auto: bsp in force"
    replay.poll(6.0)
    assert replay.label == "auto: lbbsp in force"
    assert main(["top", str(run), "--once", "--width", "170"]) == 0
    assert "policy auto: lbbsp in force" in capsys.readouterr().out
    plain = FolderSource(write_run(tmp_path / "plain", records, policy="ssp"))
    plain.poll(0.0)
    assert plain.label == "ssp"


def test_preflight_reader_is_tolerant(tmp_path):
    assert read_preflight(tmp_path) is None
    (tmp_path / "preflight.json").write_text("{not json")
    assert read_preflight(tmp_path) is None
    (tmp_path / "preflight.json").write_text(json.dumps({**PREFLIGHT, "version": 2}))
    assert read_preflight(tmp_path) is None
    (tmp_path / "preflight.json").write_text(json.dumps(PREFLIGHT))
    links = read_preflight(tmp_path)
    assert [(link.worker, link.rtt_ms) for link in links] == [("worker-0", 0.21),
                                                              ("worker-1", 4.5)]


def test_the_observe_op_over_a_real_socket(tmp_path):
    """The coordinator's node (its loop in a thread of this process) answers the op: the wire
    schema both ways and the node's op table."""
    import threading

    from paramserver.coordinator.node import CoordinatorNode
    from paramserver.spec.job import JobSpec, SyncSpec

    job = JobSpec(sync=SyncSpec("ssp"), workers=2, servers=1, batch_size=8, num_keys=8,
                  eval_interval=0.0)
    addr_file = tmp_path / "coordinator.addr"
    node = CoordinatorNode(job, address_file=str(addr_file),
                           events_path=str(tmp_path / "events.jsonl"))
    thread = threading.Thread(target=node.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not addr_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        src = ObserverSource(addr_file.read_text(), timeout=5.0)
        try:
            assert src.poll(0.0) == [] and src.silent_since is None
            assert src.members["policy"] == "ssp" and src.members["workers"] == {}
            assert src.policy == "ssp" and not src.round_mode and not src.finished
        finally:
            src.close()
    finally:
        node.finished = True
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert "top-" not in (tmp_path / "events.jsonl").read_text()


@pytest.mark.slow
def test_the_observer_reads_a_real_coordinator_without_joining(tmp_path):
    from ps_helpers import make_job, running_job

    from paramserver.client.kv import KVWorker

    with running_job(tmp_path, make_job(8, 1, 1, sync="asp")) as cluster:
        src = open_source(cluster.address)
        assert isinstance(src, ObserverSource)
        try:
            assert src.poll(0.0) == []
            assert src.members["policy"] == "asp" and not src.members["started"]
            kv = KVWorker(cluster.address)
            try:
                kv.init(np.zeros(8))
                kv.start()
                for step in range(3):
                    kv.push(np.ones(8), step=step, batch=1)
                    kv.clock(step, 1, 0.01, record={"loss": 1.0, "wait_s": 0.0})
            finally:
                kv.close()
            records, deadline = [], time.monotonic() + 10
            while time.monotonic() < deadline and len(
                    [r for r in records if r.get("kind") == "step"]) < 3:
                records += src.poll(time.monotonic())
                time.sleep(0.05)
            steps = [r for r in records if r.get("kind") == "step"]
            assert [r["step"] for r in steps] == [0, 1, 2]
            assert all(r["worker"] == 0 and "t" in r for r in steps)
        finally:
            src.close()
        events = (tmp_path / "run" / "events.jsonl").read_text()
        assert "top-" not in events  # never registered: no observer_registered line for it


def test_an_unanswered_address_gives_an_empty_view(tmp_path):
    src = ObserverSource("tcp://127.0.0.1:9", timeout=0.2)
    try:
        assert src.poll(0.0) == [] and src.silent_since == 0.0
    finally:
        src.close()
    with pytest.raises(SourceError):
        open_source(str(tmp_path / "missing"))


def test_without_a_terminal_the_view_ends_when_the_run_has(tmp_path):
    """`top RUN | ...` or from a script: nobody can press q, so once the run is finished the
    last frame is printed and top exits (it drew frames until killed)."""
    import subprocess
    import sys
    run = write_run(tmp_path / "run", bsp_run(5, {}))
    proc = subprocess.run([sys.executable, "-m", "paramserver", "top", str(run), "--width",
                           "150"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "finished" in proc.stdout and "steps 20" in proc.stdout
