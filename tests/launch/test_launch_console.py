"""`paramserver launch`: what each worker of a user's script sees (torchrun's variables) and
what the console shows (rank-prefixed output, the job progress line)."""

import io
import json
import os
import subprocess
import sys
import threading

import pytest

from paramserver.launch.console import ProgressLine, summarize
from ps_helpers import LAUNCH_SCRIPT


def test_launch_gives_each_rank_torchrun_env_and_prefixes_its_output(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import os\nprint('OMP', os.environ.get('OMP_NUM_THREADS'), flush=True)\n"
                      + LAUNCH_SCRIPT)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", "3", "--steps", "5",
         "--out", str(out), "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {}
    for line in proc.stdout.splitlines():
        if line.startswith("[rank ") and "] ENV " in line:
            prefix, env = line.split(" ENV ", 1)
            seen[int(prefix[len("[rank "):-1])] = json.loads(env)
    assert sorted(seen) == [0, 1, 2], proc.stdout
    # As torchrun does for several local ranks: one OpenMP thread each, unless set.
    assert sorted(ln for ln in proc.stdout.splitlines() if "] OMP " in ln) == [
        f"[rank {r}] OMP 1" for r in range(3)]
    join = (out / "coordinator.addr").read_text().strip()
    for rank, env in seen.items():
        assert env == {"RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": "3", "PARAMSERVER_JOIN": join}
    # Every rank's last line reaches the console (the pump drains before launch returns) and
    # its log, where it carries no prefix.
    assert sorted(line for line in proc.stdout.splitlines() if line.endswith("] done")) == [
        f"[rank {r}] done" for r in range(3)]
    # The job gives each script the rank its RANK names.
    assert sorted(line for line in proc.stdout.splitlines() if "] JOB RANK " in line) == [
        f"[rank {r}] JOB RANK {r}" for r in range(3)]
    for r in range(3):
        log = (out / "logs" / f"worker-{r}.log").read_text()
        assert log.splitlines()[-1] == "done" and "ENV {" in log
    # Not a terminal: the progress line comes as plain lines, the final one with all steps.
    final = [line for line in proc.stdout.splitlines() if line.startswith("job: steps 15 |")]
    assert final and "test_accuracy 0.875 | wait " in final[-1], proc.stdout


@pytest.mark.slow  # 5 s of a live job for one flag
def test_quiet_launch_has_no_progress_line(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(LAUNCH_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", "1", "--steps", "3",
         "--quiet", "--out", str(tmp_path / "run"), "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[rank 0] done" in proc.stdout and "job: " not in proc.stdout


def test_summary_line_counts_rate_metric_and_wait_share():
    steps = [{"t": t, "worker": t % 2, "batch": 10, "wait_s": 0.25, "loss": 2.0 - t / 10}
             for t in range(11)]
    steps[-1]["accuracy"] = 0.75
    assert summarize(steps) == ("job: steps 11 | 11 samples/s | loss 1 | accuracy 0.75 | "
                                "wait 14%")
    assert summarize([]) == "job: waiting for the first step"
    # A metric reported apart (kv.report) shows when the steps carry none.
    del steps[-1]["accuracy"]
    assert summarize(steps, metric=("test_accuracy", 0.5)).endswith(
        "loss 1 | test_accuracy 0.5 | wait 14%")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_line_is_redrawn_in_place_only_when_it_changes(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    term = _Terminal()
    line = ProgressLine(metrics, term, threading.Lock(), interval=0.0)
    line.tick()  # no file yet
    assert term.getvalue() == "\r\x1b[Kjob: waiting for the first step"
    metrics.write_text(json.dumps({"t": 0.0, "kind": "step", "worker": 0, "batch": 8}) + "\n"
                       + '{"t": 1.0, "kind": "st')  # a torn line waits for its end
    line.tick()
    line.tick()  # unchanged: nothing drawn (no flicker)
    assert term.getvalue().count("\r\x1b[K") == 2 and term.getvalue().endswith("job: steps 1 | "
                                                                               "0 samples/s")
    with line.lock:  # a worker's line: the progress line goes and comes back under it
        line.clear()
        term.write("[rank 0] hello\n")
        line.redraw()
    assert term.getvalue().endswith("\r\x1b[K[rank 0] hello\n\r\x1b[Kjob: steps 1 | 0 samples/s")
    line.close()
    assert term.getvalue().endswith("\r\x1b[Kjob: steps 1 | 0 samples/s\n")
