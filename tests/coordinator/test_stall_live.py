"""The hang doctor on real jobs: a worker SIGSTOPped mid-run. Under BSP the job hangs and the
coordinator's stall report names that worker, the step and the op the others wait on, with a
stack from every live role; under ASP the others step on and the report says the worker is
missing, not a hang. The stopped worker is then SIGCONTed (the heartbeat timeout is set long,
so recovery is not what ends the stall) and the job finishes. The fast tests of the same logic
on the pure core are in tests/coordinator/test_stall.py."""

import json
import os
import signal
import threading
import time

import pytest

from paramserver.launch.jobs import prepare_job
from paramserver.launch.local import LaunchError, LocalCluster
from paramserver.spec.config import TrainConfig
from ps_helpers import wait_for

STALL = 4.0  # --stall-timeout of these jobs


def _steps(run_dir) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count('"kind": "step"') if path.exists() else 0


def _pid_of_rank(run_dir, rank: int) -> int:
    """A built-in worker's process, from its registration: its name is w-<pid>-<hex>."""
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "worker_registered" and e["rank"] == rank:
            return int(e["src"].split("-")[1])
    raise AssertionError(f"worker rank {rank} never registered")


def _stop_a_worker_mid_run(tmp_path, sync: str):
    """Runs a 3-worker digits job; SIGSTOPs worker rank 1 once steps are flowing, waits for the
    first stall report, SIGCONTs it. Returns (report text, seconds from the stop to the report,
    events, the job's exit)."""
    job = prepare_job(TrainConfig(
        workers=3, servers=2, sync=sync, steps=60 if sync == "bsp" else 400, batch_size=16,
        eval_interval=1.0,
        heartbeat_timeout=60.0, stall_timeout=STALL, device_time="2ms"))
    run_dir = tmp_path / "run"
    cluster = LocalCluster(job, run_dir, job_timeout=240, keys=None)
    errors = []
    try:
        cluster.start()

        def supervise():
            try:
                cluster.wait()
            except LaunchError as exc:
                errors.append(exc)
        supervisor = threading.Thread(target=supervise, daemon=True)
        supervisor.start()
        wait_for(lambda: _steps(run_dir) >= 30, "30 steps", 120)
        pid = _pid_of_rank(run_dir, 1)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            report = wait_for(lambda: (run_dir / "stall-1.txt").exists(), "a stall report",
                               4 * STALL)
            took = time.monotonic() - stopped
        finally:
            os.kill(pid, signal.SIGCONT)
        supervisor.join(180)
        assert not supervisor.is_alive(), "the job did not end after SIGCONT"
    finally:
        cluster.stop()
    assert report
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    text = (run_dir / "stall-1.txt").read_text()
    return text, took, events, errors, cluster.coordinator.proc.returncode


@pytest.mark.slow
def test_a_stopped_worker_under_bsp_is_named_by_a_stall_report(tmp_path):
    text, took, events, errors, code = _stop_a_worker_mid_run(tmp_path, "bsp")
    print(text)
    assert took < 2 * STALL, f"the report came {took:.1f} s after the stop"
    assert "HANG: no step completed" in text
    missing = [line for line in text.splitlines() if line.startswith("missing:")]
    assert len(missing) == 1 and "worker rank 1" in missing[0], missing
    assert "did not answer the probe" in missing[0]
    step = int(missing[0].split("owes its clock of step ")[1].split(";")[0])
    # the others clocked that step and wait for the release into the next, from the coordinator
    assert f"clocked step {step} and wait for the release" in text
    assert "the round waits on rank 1" in text
    assert f"waits for: release, step {step + 1}, from coordinator" in text
    # a stack for every live role: coordinator, 2 live workers, 2 servers, the evaluator
    sections = [line for line in text.splitlines() if line.startswith("--- ")]
    answered = text.count("stack (faulthandler, every thread):")
    assert answered == 6, sections
    for role in ("--- coordinator ---", "--- worker rank 0", "--- worker rank 2",
                 "--- server rank 0", "--- server rank 1", "--- observer rank"):
        assert any(s.startswith(role) for s in sections), (role, sections)
    assert "(no answer: stopped" in text.split("--- worker rank 1")[1].split("\n--- ")[0]
    assert "flight recorder (last" in text and "send op=clock" in text
    stall = [e for e in events if e["event"] == "stall"]
    assert stall[0]["verdict"] == "hang" and stall[0]["missing"] == [1]
    # SIGCONT: the job went on and finished
    assert not errors and code == 0, errors
    assert not [e for e in events if e["event"] == "worker_left" and e["reason"] == "dead"]


@pytest.mark.slow
def test_a_stopped_worker_under_asp_is_reported_missing_not_a_hang(tmp_path):
    text, took, events, errors, code = _stop_a_worker_mid_run(tmp_path, "asp")
    print(text)
    assert took < 2 * STALL, f"the report came {took:.1f} s after the stop"
    assert "MISSING WORKER (not a hang" in text and "HANG" not in text
    missing = [line for line in text.splitlines() if line.startswith("missing:")]
    assert len(missing) == 1 and "worker rank 1" in missing[0], missing
    stall = [e for e in events if e["event"] == "stall"]
    assert [e["verdict"] for e in stall] == ["missing"] and stall[0]["missing"] == [1]
    assert not errors and code == 0, errors


@pytest.mark.slow
def test_an_announced_pause_is_not_flagged_and_a_silent_step_is_a_hang_with_the_stack(tmp_path):
    """One worker of a tiny BSP job (coordinator and shard as processes, the worker here):
    its `paused()` evaluation outlasts the stall timeout unflagged; then it stops stepping
    (alive, heartbeating) and the report holds its own stack, parked in this function."""
    import numpy as np

    from paramserver.client.kv import KVWorker
    from ps_helpers import make_job, running_job
    with running_job(tmp_path, make_job(8, 1, 1, sync="bsp", stall_timeout=1.0)) as cluster:
        run_dir = cluster.run_dir
        kv = KVWorker(cluster.address)
        try:
            kv.init(np.zeros(8))
            release = kv.start()
            for _ in range(5):
                kv.push(np.ones(8), step=release.step, batch=1)
                release = kv.clock(release.step, batch=1, compute_time=0.001)
            with kv.session.paused("evaluation"):
                time.sleep(1.6)
            release = kv.clock(release.step, batch=1, compute_time=0.001)
            assert not list(run_dir.glob("stall-*.txt"))
            wait_for(lambda: (run_dir / "stall-1.txt").exists(), "a stall report", 10)
            text = (run_dir / "stall-1.txt").read_text()
        finally:
            kv.close()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    pauses = [(e["event"], e["reason"]) for e in events if e["event"] in ("pause", "resume")]
    assert pauses == [("pause", "evaluation (worker rank 0)"),
                      ("resume", "evaluation (worker rank 0)")]
    assert "HANG: no step completed" in text
    assert "waiting: no worker's clock is held" in text  # it is inside its step (sleeping)
    assert "test_an_announced_pause_is_not_flagged" in text  # its main thread's stack
    assert "in wait_for" in text and text.count("stack (faulthandler") == 3  # + shard, coord
