"""`paramserver serve`: a bare job for a key count that the README's KV example joins as
written (the one change: the port, a free one instead of 5555, so tests can run side by side)."""

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
README_ADDRESS = "tcp://127.0.0.1:5555"


def kv_snippet() -> str:
    text = README.read_text()
    section = text[text.index("## The KV API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path, *extra):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "paramserver", "serve", "--num-keys", "1000", "--port", str(port),
         "--out", str(tmp_path / "run"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # printed once the coordinator listens
    return proc, port, first


def _reap(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_readme_kv_snippet_runs_against_a_bare_job(tmp_path):
    snippet = kv_snippet()
    assert snippet.count(README_ADDRESS) == 1 and "KVWorker(" in snippet
    proc, port, first = _serve(tmp_path, "--servers", "2", "--steps", "5")
    try:
        address = f"tcp://127.0.0.1:{port}"
        assert f"join at {address}" in first, first + proc.stderr.read()
        code = snippet.replace(README_ADDRESS, address) + "\nprint('steps', release.step)\n"
        t0 = time.monotonic()
        user = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
        assert user.returncode == 0, user.stderr[-3000:]
        assert "steps" in user.stdout and time.monotonic() - t0 < 60
        # The job ends when its step budget is spent: serve exits on its own.
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-3000:]
    finally:
        _reap(proc)
    rounds = (tmp_path / "run" / "events.jsonl").read_text().count('"event": "apply_round"')
    assert rounds == 5 and "steps 5" in user.stdout


def test_serve_refuses_a_bad_key_count(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "paramserver", "serve", "--num-keys", "0",
                           "--out", str(tmp_path / "x")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--num-keys must be at least 1" in proc.stderr
