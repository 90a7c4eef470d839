"""`paramserver top` in a real terminal (tmux) beside a real job: one worker 3x slower all along,
another 3x slower for 5 s. The first must be flagged chronic within 20 steps, the second
transient and then cleared; q ends the view. The same logic on synthetic records runs by default
in tests/observe/test_observe_stats.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")]

# Worker 1 is 3x slower throughout; worker 2 for 5 s of its time (the straggler grammar's
# schedule, counted from the worker's start, which is about the start barrier's).
STRAGGLER = "1:3+schedule:2:30-35=3"
FLAG = re.compile(r"worker (\d+) step (\d+) -> (chronic|transient|ok)")


SOCKET = f"paramserver-top-test-{os.getpid()}"  # a tmux server of its own


def tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, timeout=10,
                          check=check)


def rows(screen: str) -> dict[int, str]:
    """Worker rank -> its state cell, from the workers table on the screen."""
    out = {}
    for line in screen.splitlines():
        cells = line.strip("│ ").split()
        if len(cells) > 12 and cells[0].isdigit() and cells[1].isdigit():
            for state in ("chronic", "transient", "ok"):
                if state in cells:
                    out[int(cells[0])] = state
    return out


def test_top_flags_a_chronic_straggler_and_a_transient_slowdown_live(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in [str(Path(__file__).resolve().parents[2] / "src"),
                    os.environ.get("PYTHONPATH", "")] if p)}
    job = subprocess.Popen(
        [sys.executable, "-m", "paramserver", "train", "--workers", "4", "--straggler",
         STRAGGLER, "--device-time", "16ms", "--max-seconds", "60", "--epochs", "1000",
         "--out", str(run), "--quiet"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    session = f"top-{os.getpid()}"
    seen: dict[tuple[int, str], float] = {}  # (worker, state) -> first time on screen
    flags: dict[tuple[int, str], int] = {}  # (worker, state) -> the step the flags line names
    screens = []
    try:
        addr_file = run / "coordinator.addr"
        deadline = time.monotonic() + 120
        while not addr_file.exists() and time.monotonic() < deadline:
            assert job.poll() is None, job.communicate()
            time.sleep(0.2)
        address = addr_file.read_text().strip()
        command = (f"env -u COLUMNS -u LINES PYTHONPATH={env['PYTHONPATH']} {sys.executable} "
                   f"-m paramserver top {address} --keys {run / 'keys'} --refresh 4")
        tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "50", command)
        t0 = time.monotonic()
        deadline = t0 + 200
        while time.monotonic() < deadline and job.poll() is None:
            screen = tmux("capture-pane", "-p", "-t", session).stdout
            screens.append(screen)
            now = time.monotonic() - t0
            for w, state in rows(screen).items():
                seen.setdefault((w, state), now)
            for w, step, state in FLAG.findall(screen):
                flags.setdefault((int(w), state), int(step))
            if (2, "ok") in flags and (2, "transient") in flags and (1, "chronic") in flags:
                break
            time.sleep(0.5)
        final = tmux("capture-pane", "-p", "-e", "-t", session).stdout
        (tmp_path / "screen.ansi").write_text(final)
        tmux("send-keys", "-t", session, "q")
        gone_by = time.monotonic() + 10
        while time.monotonic() < gone_by and tmux("has-session", "-t", session,
                                                  check=False).returncode == 0:
            time.sleep(0.2)
        assert tmux("has-session", "-t", session, check=False).returncode != 0, \
            "top did not end on q"
    finally:
        tmux("kill-server", check=False)
        if job.poll() is None:
            job.terminate()
        try:
            job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            job.communicate(timeout=10)
    report = f"seen {seen}, flags {flags}; last screen:\n{screens[-1] if screens else ''}"
    print(report)
    assert (1, "chronic") in flags and flags[(1, "chronic")] < 20, report
    assert flags.get((2, "transient")) is not None, report
    assert (2, "chronic") not in flags, report
    assert flags.get((2, "ok"), -1) > flags[(2, "transient")], report
    assert seen.get((1, "chronic")) is not None and seen.get((2, "transient")) is not None
    for w in (0, 3):
        assert (w, "chronic") not in flags and (w, "transient") not in flags, report
