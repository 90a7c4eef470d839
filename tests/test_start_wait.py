"""A job that does not start says whom it waits for, on both sides, and gives up naming them
(live: `paramserver serve` and a KV client, a few seconds each)."""

import subprocess
import sys

from test_serve import README_ADDRESS, _reap, _serve, kv_snippet

STALL = """
import time
from paramserver.client.kv import KVWorker
kv = KVWorker({address!r})   # registers, then never calls start()
time.sleep(30)
"""


def test_a_worker_and_the_coordinator_say_whom_the_start_barrier_waits_for(tmp_path):
    proc, port, first = _serve(tmp_path, "--workers", "2", "--steps", "3",
                               "--start-timeout", "8")
    try:
        address = f"tcp://127.0.0.1:{port}"
        assert "waiting for 2 worker(s)" in first
        code = kv_snippet().replace(README_ADDRESS, address)
        user = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
        assert user.returncode == 0, user.stderr[-3000:]
        # The one worker that came heard, while it waited, that rank 1 never registered.
        assert (f"for the start barrier at {address}: 1 of 2 workers started (ranks 0); "
                "not registered: 1; servers: 1/1 registered") in user.stderr, user.stderr
        assert proc.wait(timeout=60) == 0
    finally:
        _reap(proc)
    log = (tmp_path / "run" / "logs" / "coordinator-0.log").read_text()
    assert "start barrier: waiting, 1 of 2 workers started (ranks 0); not registered: 1" in log
    assert "only 1 of 2 workers started within 8 s; going on with them" in log


def test_a_job_whose_workers_never_start_fails_naming_them(tmp_path):
    proc, port, _ = _serve(tmp_path, "--start-timeout", "6")
    stall = subprocess.Popen([sys.executable, "-c",
                              STALL.format(address=f"tcp://127.0.0.1:{port}")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert proc.wait(timeout=60) == 1
        err = proc.stderr.read()
        assert "no worker started within 6 s; expected 1, registered: rank 0" in err, err
        assert "registered, not started: 0; servers: 1/1 registered" in err
    finally:
        stall.kill()
        stall.wait(10)
        _reap(proc)
