"""`paramserver serve`: a bare job for a key count that the README's KV example joins as
written (the one change: the port, a free one instead of 5555, so tests can run side by side)."""

import subprocess
import sys
import time

import pytest

from ps_helpers import README_ADDRESS, kv_snippet, reap, serve_bare_job


def test_readme_kv_snippet_runs_against_a_bare_job(tmp_path):
    snippet = kv_snippet()
    assert snippet.count(README_ADDRESS) == 1 and "KVWorker(" in snippet
    proc, port, first = serve_bare_job(tmp_path, "--servers", "2", "--steps", "5")
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
        reap(proc)
    rounds = (tmp_path / "run" / "events.jsonl").read_text().count('"event": "apply_round"')
    assert rounds == 5 and "steps 5" in user.stdout


def test_serve_refuses_a_bad_key_count(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "paramserver", "serve", "--num-keys", "0",
                           "--out", str(tmp_path / "x")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--num-keys must be at least 1" in proc.stderr


def _two_snippet_workers(tmp_path, *sync: str) -> list[float]:
    """The README's KV example as two workers of a `serve --sync ...` job of 20 steps each;
    each one's final value of key 0."""
    proc, port, first = serve_bare_job(tmp_path, "--servers", "2", "--steps", "20",
                                       "--workers", "2", "--sync", *sync)
    try:
        code = (kv_snippet().replace(README_ADDRESS, f"tcp://127.0.0.1:{port}")
                .replace("kv.bye()", "print('final', float(kv.pull()[0])); kv.bye()"))
        users = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [u.communicate(timeout=120) for u in users]
        assert all(u.returncode == 0 for u in users), [e[-2000:] for _, e in outs]
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-3000:]
    finally:
        reap(proc)
    return [float(out.split("final")[1]) for out, _ in outs]


@pytest.mark.slow  # ~12 s; fast twin: test_worker_core's push_fields of a lockstep release
def test_the_kv_example_under_auto_takes_bsp_rounds_as_fixed_bsp_does(tmp_path):
    """auto's lockstep rounds are summed on the shards by the round the release names; the
    README's client names none, so each of its pushes was applied whole on arrival: two
    workers moved the parameters twice as far as under fixed BSP (-4 against -2)."""
    bsp = _two_snippet_workers(tmp_path / "bsp", "bsp")
    # (its lockstep candidates only: a switch to ssp or asp would change the sum)
    auto = _two_snippet_workers(tmp_path / "auto", "auto", "--sync-opt", "candidates=lbbsp,bsp")
    assert bsp == [bsp[0]] * 2 and abs(bsp[0] + 2.0) < 1e-5  # 20 rounds of the mean, lr 0.1
    assert auto == bsp
