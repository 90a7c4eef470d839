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


def test_a_ctrl_c_or_sigterm_to_the_terminals_group_leaves_the_zygote_alive_and_quiet(tmp_path):
    """The zygote shares the launcher's process group: a Ctrl-C (or a SIGTERM to the group)
    while it preloads torch killed it with a KeyboardInterrupt traceback on the terminal, and
    with it every role it would fork, before the launcher could save what they trained."""
    import signal
    code = (
        "import os, signal, time\n"
        "from multiprocessing import forkserver\n"
        "from paramserver.launch import zygote\n"
        "zygote.warm()\n"
        "pid = forkserver._forkserver._forkserver_pid\n"
        "got = []\n"
        "for s in (signal.SIGINT, signal.SIGTERM):\n"
        "    signal.signal(s, lambda n, f: got.append(n))\n"
        "print(pid, flush=True)\n"
        "deadline = time.monotonic() + 60\n"
        "while len(got) < 2 and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "p = zygote._zygote().Process(target=os.getpid)\n"
        "p.start()\n"
        "p.join(60)\n"
        "print(p.exitcode, forkserver._forkserver._forkserver_pid == pid, flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        zygote_pid = int(proc.stdout.readline())
        assert psutil.pid_exists(zygote_pid)
        os.killpg(proc.pid, signal.SIGINT)  # as the terminal does, during the zygote's preload
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err[-2000:]
    assert out.split() == ["0", "True"], (out, err[-2000:])  # the same zygote forked the role
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
