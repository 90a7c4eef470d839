"""A local job's roles forked from the zygote (launch/zygote.py): each is its own process, with
its own process group, the launcher's working folder and the environment it was given, and
the launcher's own main module is never run again in it."""

import os
import subprocess
import sys
from pathlib import Path

import psutil

from paramserver.launch.local import LocalCluster
from ps_helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _job():
    return {"num_keys": 8, "dtype": "float32", "servers": 1, "workers": 1, "batch_size": 1,
            "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 0.1},
            "heartbeat_timeout": 10.0}


def test_a_forked_role_is_a_process_of_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cluster = LocalCluster(_job(), Path("run"), keys=None)
    try:
        cluster.start(spawn_workers=False)
        server = next(c for c in cluster.children if c.role == "server")
        proc = psutil.Process(server.proc.pid)
        assert proc.ppid() != os.getpid()  # forked by the zygote, not by the launcher
        # (start() returns once the coordinator is up: the server, started beside it, may
        # still be between its fork and its first lines)
        wait_for(lambda: os.getpgid(proc.pid) == proc.pid,  # Ctrl-C is the launcher's alone
                 "the forked server in a process group of its own", timeout=30.0)
        wait_for(lambda: proc.cwd() == str(tmp_path),  # relative paths mean what they meant
                 "the forked server in the launcher's folder", timeout=30.0)
        # (Its environment is the one given: every CURVE job's roles find their keys through
        # $PARAMSERVER_KEYS, which /proc's initial environment would not show.)
    finally:
        cluster.stop()
    assert server.proc.poll() is not None  # reaped by stop()


def test_a_launcher_run_from_python_c_starts_its_roles(tmp_path):
    """multiprocessing would import the launcher's __main__ in each child: from `python -c`
    (or stdin, or a script without a main guard) that fails or reruns the script."""
    code = ("from paramserver.cli.main import main; raise SystemExit(main(['train', "
            "'--steps', '1', '--workers', '1', '--quiet', '--eval-interval', '0', "
            f"'--out', {str(tmp_path / 'run')!r}]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "run" / "summary.json").exists()
