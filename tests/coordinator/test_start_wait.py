"""A job that does not start says whom it waits for, on both sides, and gives up naming them
(live: `paramserver serve` and a KV client, a few seconds each)."""

import select
import subprocess
import sys
import time

import pytest

from ps_helpers import README_ADDRESS, reap, serve_bare_job, kv_snippet

STALL = """
import time
from paramserver.client.kv import KVWorker
kv = KVWorker({address!r})   # registers, then never calls start()
time.sleep(30)
"""


def _line_with(pipe, text: str, within: float) -> str:
    """The first line of `pipe` holding `text`, read for at most `within` s."""
    deadline, seen = time.monotonic() + within, []
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([pipe], [], [], left)[0]:
            break
        line = pipe.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r} within {within} s:\n{''.join(seen)}")


@pytest.mark.slow  # ~14 s of waiting for the report; the fast twin checks the same words in the
# core: tests/coordinator/test_coordinator_core.py::test_the_start_barrier_says_whom_it_waits_...
def test_a_worker_and_the_coordinator_say_whom_the_start_barrier_waits_for(tmp_path):
    proc, port, first = serve_bare_job(tmp_path, "--workers", "2", "--steps", "3")
    users = []
    try:
        address = f"tcp://127.0.0.1:{port}"
        assert "waiting for 2 worker(s)" in first
        code = kv_snippet().replace(README_ADDRESS, address)
        users.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
        # The one worker that came hears, while it waits, that rank 1 never registered ...
        _line_with(users[0].stderr, f"for the start barrier at {address}: 1 of 2 workers "
                   "started (ranks 0); not registered: 1; servers: 1/1 registered", 60)
        # ... and once the second one comes, both train and the job ends.
        users.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
        for user in users:
            assert user.wait(timeout=60) == 0, user.stderr.read()[-3000:]
        assert proc.wait(timeout=60) == 0
    finally:
        for user in users:
            if user.poll() is None:
                user.kill()
                user.wait(10)
        reap(proc)
    log = (tmp_path / "run" / "logs" / "coordinator-0.log").read_text()
    assert "start barrier: waiting, 1 of 2 workers started (ranks 0); not registered: 1" in log


@pytest.mark.slow  # 12 s of start timeout; tests/coordinator/test_coordinator_core.py's
# test_no_worker_started_in_time_fails_the_job checks the same failure and text without sockets
def test_a_job_whose_workers_never_start_fails_naming_them(tmp_path):
    proc, port, _ = serve_bare_job(tmp_path, "--start-timeout", "9")
    stall = subprocess.Popen([sys.executable, "-c",
                              STALL.format(address=f"tcp://127.0.0.1:{port}")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert proc.wait(timeout=60) == 1
        err = proc.stderr.read()
        assert "no worker started within 9 s; expected 1, registered: rank 0" in err, err
        assert "registered, not started: 0; servers: 1/1 registered" in err
    finally:
        stall.kill()
        stall.wait(10)
        reap(proc)


GIVE_UP = """
import time
from paramserver.client.kv import KVWorker
kv = KVWorker({address!r}, release_timeout=8)
t0 = time.monotonic()
try:
    kv.start()
except TimeoutError as exc:
    print(f"gave up after {{time.monotonic() - t0:.0f}} s: {{exc}}")
kv.close()
"""


@pytest.mark.slow  # 12 s: the release timeout runs out; the default suite is near its budget
def test_a_worker_whose_start_is_never_released_gives_up_naming_the_missing_peers(tmp_path):
    proc, port, _ = serve_bare_job(tmp_path, "--workers", "2", "--start-timeout", "60")
    try:
        address = f"tcp://127.0.0.1:{port}"
        user = subprocess.run([sys.executable, "-c", GIVE_UP.format(address=address)],
                              capture_output=True, text=True, timeout=60)
        assert user.returncode == 0, user.stderr[-3000:]
        assert "gave up after 8 s: coordinator at " in user.stdout, user.stdout + user.stderr
        assert ("did not answer 'start' within 8 s; the start barrier was waiting: 1 of 2 "
                "workers started (ranks 0); not registered: 1; servers: 1/1 registered"
                ) in user.stdout
    finally:
        reap(proc)
