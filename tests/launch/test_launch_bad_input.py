"""Bad user scripts under `paramserver launch`: each ends with a clear error naming the rank,
and no rank is left waiting. Real launches of three workers; every wait bounded.

(A rank that raises mid-run: tests/client/test_user_api.py; one that dies before the start:
tests/launch/test_api_launch.py.)"""

import subprocess
import sys
import textwrap
import time

import pytest

from paramserver.launch.core.verdict import (
    NO_STEP_REASON, RankRecord, ends_job_before_start, rank_records, worker_failures,
)
from paramserver.runlog.metrics import read_records


def launch(tmp_path, script: str, *flags: str, timeout: float = 90, workers: int = 3):
    path = tmp_path / "user.py"
    path.write_text(textwrap.dedent(script))
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", str(workers), "--quiet",
         "--out", str(out), "--timeout", str(timeout), *flags, "--", sys.executable, str(path)],
        capture_output=True, text=True, timeout=timeout + 60)
    return proc, out, time.monotonic() - t0


def test_the_decision_on_a_workers_exit():
    # Before the barrier opens: a failure ends the job unless restarted; exit 0 always does.
    assert ends_job_before_start(1, False, False) and not ends_job_before_start(1, False, True)
    assert ends_job_before_start(0, False, True)
    assert not ends_job_before_start(1, True, False) and not ends_job_before_start(None, False,
                                                                                   False)
    records = rank_records([{"kind": "step", "worker": 0}, {"kind": "step", "worker": 0},
                            {"kind": "left", "worker": 1, "reason": NO_STEP_REASON},
                            {"kind": "left", "worker": 3, "reason": "done"}])
    assert records[0] == RankRecord(2, None)
    failures = worker_failures({0: 0, 1: 0, 2: 0, 3: 0, 4: 3}, records)
    assert failures == [
        (1, "rank 1 finished without calling opt.step() once (it closed its "
            "DistributedOptimizer first)"),
        (2, "rank 2 finished without calling opt.step() once (it never joined the job)"),
        (4, "rank 4 exited with code 3")]  # rank 3: the job had stopped before its first step


MISMATCH = """
    import os, time, torch, paramserver
    from torch import nn
    if os.environ["RANK"] == "1":
        # The odd one out joins once rank 0's layout is the job's (the first to join sets it).
        for _ in range(600):
            if os.path.exists(LAYOUT_FILE):
                break
            time.sleep(0.1)
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    else:  # the same parameter count, other names: the key count alone cannot tell
        model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 10))
    with paramserver.DistributedOptimizer(model) as opt:
        while not opt.should_stop:
            opt.zero_grad(); model(torch.ones(4, 64)).sum().backward(); opt.step()
"""


def test_a_rank_whose_model_differs_ends_the_launch_naming_it_and_the_parameter(tmp_path):
    script = MISMATCH.replace("LAYOUT_FILE", repr(str(tmp_path / "run" / "model_layout.json")))
    proc, out, took = launch(tmp_path, script, "--steps", "5", workers=2)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "worker 1 died with exit code 1 before the job started" in proc.stderr
    assert ("rank 1's model differs from the job's (rank 0's, the first to join): parameter 2: "
            "'1.weight' (10, 128) on rank 0, '2.weight' (10, 128) on rank 1; every rank must "
            "build the same model") in proc.stderr, proc.stderr[-3000:]
    assert took < 60, f"the launch took {took:.0f} s"
    layout = (out / "model_layout.json").read_text()
    assert '"1.weight"' in layout and '"2.weight"' not in layout


def test_a_job_every_rank_refuses_is_said_with_a_ranks_own_error(tmp_path):
    """Every rank's model is float32 in a float64 job: each refuses to join and the
    coordinator fails the job, counting them. The launch quoted the coordinator's log, which
    held only the count; the cause is the ranks' output."""
    script = """
        import torch, paramserver
        model = torch.nn.Linear(4, 1)
        with paramserver.DistributedOptimizer(model) as opt:
            pass
    """
    proc, _, took = launch(tmp_path, script, "--steps", "5", "--dtype", "float64", workers=2)
    assert proc.returncode == 1, proc.stderr[-3000:]
    said = proc.stderr[proc.stderr.index("paramserver launch: the job failed"):]
    assert "every worker left the job and none finished it" in said, said
    assert "worker 0's last output:" in said and "the coordinator's last output" not in said
    assert ("the job holds float64 parameters, the model is torch.float32: launch the job "
            "with --dtype float32 or convert the model (model.to(torch.float64))") in said
    assert took < 60, f"the launch took {took:.0f} s"


NO_OPTIMIZER = """
    import os, torch, paramserver
    if os.environ["RANK"] == "2":
        raise SystemExit(0)  # forgot to build the optimizer: nothing joins for rank 2
    model = torch.nn.Linear(4, 1)
    with paramserver.DistributedOptimizer(model) as opt:
        while not opt.should_stop:
            opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
"""


def test_a_rank_that_dies_silently_before_the_start_is_named_and_said_to_have_printed_nothing(
        tmp_path):
    """A script that exits 3 at once, printing nothing: the launch ends naming the rank and
    its exit, and says it printed nothing rather than quoting an empty output."""
    proc, _, took = launch(tmp_path, "import sys\nsys.exit(3)\n", workers=2, timeout=60)
    assert proc.returncode != 0
    assert "died with exit code 3 before the job started" in proc.stderr, proc.stderr
    assert "it printed nothing" in proc.stderr and "last output" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < 50, f"the launch waited {took:.0f} s for ranks that had died"


@pytest.mark.slow
def test_a_rank_that_exits_0_without_joining_ends_the_launch_naming_it(tmp_path):
    proc, _, took = launch(tmp_path, NO_OPTIMIZER, "--steps", "5")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("rank 2 exited with code 0 before the job started, without joining it (did the "
            "script construct paramserver.DistributedOptimizer?)") in proc.stderr, proc.stderr
    assert took < 60, f"the launch waited {took:.0f} s for a rank that had exited"


NO_STEP = """
    import os, torch, paramserver
    model = torch.nn.Linear(4, 1)
    opt = paramserver.DistributedOptimizer(model)
    if os.environ["RANK"] == "1":
        opt.close()  # joined, then left without a step
        raise SystemExit(0)
    elif os.environ["RANK"] == "2":
        raise SystemExit(0)  # joined, then returned without step() or close()
    while not opt.should_stop:
        opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
    opt.close()
"""


@pytest.mark.slow  # a 3-rank launch; the default suite keeps the verdict's own test above
def test_ranks_that_join_but_never_step_are_named_and_nobody_waits_for_them(tmp_path):
    # A heartbeat timeout far above the test's time: rank 0 finishing shows that the ranks
    # that left were not waited for.
    proc, out, took = launch(tmp_path, NO_STEP, "--steps", "6", "--heartbeat-timeout", "120")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("rank 1 finished without calling opt.step() once (it closed its "
            "DistributedOptimizer first)") in proc.stderr, proc.stderr
    assert "rank 2 finished without calling opt.step() once" in proc.stderr
    assert "rank 0" not in proc.stderr
    records = list(read_records(out / "metrics.jsonl"))
    left = {r["worker"]: r["reason"] for r in records if r["kind"] == "left"}
    assert left == {0: "done", 1: NO_STEP_REASON, 2: NO_STEP_REASON}
    assert {r["worker"] for r in records if r["kind"] == "step"} == {0}
    assert took < 60


KILLED = """
    import os, torch, paramserver
    model = torch.nn.Linear(4, 1)
    with paramserver.DistributedOptimizer(model) as opt:
        while not opt.should_stop:
            if opt.rank == 1 and opt.release.step == 3:
                os._exit(3)  # dies mid-run without a word (no exception, no bye)
            opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
"""


@pytest.mark.slow  # waits out a heartbeat timeout
def test_a_rank_killed_mid_run_is_named_and_the_others_finish(tmp_path):
    # (A rank that raises mid-run leaves at once: tests/client/test_user_api.py.) One that dies
    # without a word is declared dead after --heartbeat-timeout; BSP then goes on without it.
    proc, out, took = launch(tmp_path, KILLED, "--steps", "8", "--heartbeat-timeout", "3",
                             workers=2)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "rank 1 exited with code 3" in proc.stderr and "rank 0" not in proc.stderr
    left = {r["worker"]: r["reason"] for r in read_records(out / "metrics.jsonl")
            if r["kind"] == "left"}
    assert left == {0: "done", 1: "dead"}
    assert took < 90
