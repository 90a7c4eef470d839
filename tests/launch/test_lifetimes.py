"""Nothing outlives its job: every role started by hand exits within 2 heartbeat timeouts of
losing the peer it depends on, with and without CURVE; a CURVE process failing right after it
bound exits; a SIGKILLed launcher leaves its keys in its own run folder only.

"Heartbeat timeout" is the limit of the link that died: `coordinator_timeout` for a role's
coordinator (a restarted coordinator may take it back until then), `heartbeat_timeout` for a
worker's shard servers and for the coordinator's workers. Beats go every 20 ms, so that a dead
peer's queue (64 messages) is full well within the timeout: a blocked send shows. (3 s
timeouts leave the 6 s bound room for a Python process with torch to exit on 2 busy cores.)
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from paramserver.core.exits import Exit
from paramserver.transport import security

PY = [sys.executable, "-m", "paramserver"]
BEAT = 0.02
COORDINATOR_TIMEOUT = 3.0
HEARTBEAT_TIMEOUT = 3.0
STARTUP = 60.0  # python, torch and the model on 2 busy cores


class Procs:
    """Processes started by a test, each killed and reaped at its end."""

    def __init__(self, folder: Path):
        self.folder, self.procs = folder, {}

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "wb")
        with log:
            proc = subprocess.Popen(PY + args, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.close()


def _job(tmp_path: Path, workers: int = 1, **limits) -> Path:
    """A job file of the train task (digits, mlp), ASP, long enough never to end by itself."""
    from paramserver.launch.jobs import prepare_job
    from paramserver.spec.config import TrainConfig
    job = prepare_job(TrainConfig(workers=workers, servers=1, sync="asp", eval_interval=0,
                                  max_seconds=600.0, batch_size=8))
    job["limits"].update({"heartbeat_interval": BEAT, "heartbeat_timeout": HEARTBEAT_TIMEOUT,
                          "coordinator_timeout": COORDINATOR_TIMEOUT, **limits})
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


def _keys(tmp_path: Path, curve: bool) -> list[str]:
    if not curve:
        return []
    folder = tmp_path / "keys"
    if not folder.exists():
        security.generate(folder)
    return ["--keys", str(folder)]


def _wait_for(what: str, ready, timeout: float = STARTUP, procs: Procs | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if procs is not None:
            for name, proc in procs.procs.items():
                assert proc.poll() is None, f"{name} exited early:\n{procs.log(name)}"
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.05)


def _start_job(procs: Procs, tmp_path: Path, curve: bool, job: Path, roles=("server",)) -> str:
    keys = _keys(tmp_path, curve)
    addr_file = tmp_path / "coordinator.addr"
    procs.start("coordinator", ["coordinator", "--job", str(job), "--address-file",
                                str(addr_file), "--events", str(tmp_path / "events.jsonl")]
                + keys)
    _wait_for("the coordinator's address", addr_file.exists, procs=procs)
    addr = addr_file.read_text().strip()
    for role in roles:
        procs.start(role, [role, "--join", addr] + keys)
    return addr


def _events(tmp_path: Path) -> str:
    path = tmp_path / "events.jsonl"
    return path.read_text() if path.exists() else ""


def _training(tmp_path: Path) -> bool:
    return '"barrier_open"' in _events(tmp_path)


def _exit_within(procs: Procs, name: str, limit: float, killed: float) -> float:
    """Seconds from `killed` to `name`'s exit; fails past `limit`."""
    proc = procs.procs[name]
    try:
        proc.wait(max(0.0, killed + limit - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{name} outlived its peer by {limit:g} s:\n"
                             f"{procs.log(name)[-2000:]}") from None
    return time.monotonic() - killed


def _kill(procs: Procs, name: str) -> float:
    proc = procs.procs[name]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    return time.monotonic()


def _plain_and_curve(tmp_path: Path, scenario) -> None:
    """`scenario(procs, folder, curve)` for a plaintext job and a CURVE job, side by side: each
    is mostly waiting (for a timeout to run out, for the queue's worth of beats), so together
    they take little more than one. Each has its own folder, processes and keys."""
    failures: dict[str, BaseException] = {}

    def run(name: str, curve: bool) -> None:
        folder = tmp_path / name
        folder.mkdir()
        procs = Procs(folder)
        try:
            scenario(procs, folder, curve)
        except BaseException as e:  # noqa: BLE001 - raised again below, naming the variant
            failures[name] = e
        finally:
            procs.close()

    threads = [threading.Thread(target=run, args=variant, daemon=True)
               for variant in (("plain", False), ("curve", True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * STARTUP)
    assert not any(t.is_alive() for t in threads), f"a variant ran past {3 * STARTUP:.0f} s"
    if failures:
        raise AssertionError("; ".join(f"{name}: {e}" for name, e in failures.items())
                             ) from next(iter(failures.values()))


def _worker_loses_its_coordinator(procs: Procs, tmp_path: Path, curve: bool) -> None:
    _start_job(procs, tmp_path, curve, _job(tmp_path), roles=("server", "worker"))
    _wait_for("training", lambda: _training(tmp_path), procs=procs)
    time.sleep(0.5)
    killed = _kill(procs, "coordinator")
    _exit_within(procs, "worker", 2 * COORDINATOR_TIMEOUT, killed)
    # Retryable, in one line: an orchestrator may run it again once a coordinator is back.
    assert procs.procs["worker"].returncode == Exit.PEER_LOST, procs.log("worker")[-2000:]
    assert "Traceback" not in procs.log("worker")


def test_a_worker_started_by_hand_exits_once_its_coordinator_is_gone(tmp_path):
    _plain_and_curve(tmp_path, _worker_loses_its_coordinator)


def _worker_loses_its_server(procs: Procs, tmp_path: Path, curve: bool) -> None:
    _start_job(procs, tmp_path, curve, _job(tmp_path), roles=("server", "worker"))
    _wait_for("training", lambda: _training(tmp_path), procs=procs)
    time.sleep(0.5)
    killed = _kill(procs, "server")
    _exit_within(procs, "worker", 2 * HEARTBEAT_TIMEOUT, killed)
    assert "unreachable" in procs.log("worker")
    assert procs.procs["worker"].returncode == Exit.PEER_LOST


@pytest.mark.slow  # fast twins: a worker gone with its coordinator; the launched roles
def test_a_worker_started_by_hand_exits_once_its_server_is_gone(tmp_path):
    _plain_and_curve(tmp_path, _worker_loses_its_server)


def _server_and_evaluator_lose_their_coordinator(procs: Procs, tmp_path: Path,
                                                 curve: bool) -> None:
    # Two workers expected, none started: the evaluator waits for training, asking the status.
    _start_job(procs, tmp_path, curve, _job(tmp_path, workers=2),
               roles=("server", "evaluator"))
    _wait_for("the server and the evaluator joining",
              lambda: all(f'"{kind}"' in _events(tmp_path)
                          for kind in ("server_joined", "observer_registered")), procs=procs)
    time.sleep(3 * BEAT * 64)  # (a full queue's worth of beats, answered)
    killed = _kill(procs, "coordinator")
    for role in ("server", "evaluator"):
        _exit_within(procs, role, 2 * COORDINATOR_TIMEOUT, killed)
        assert procs.procs[role].returncode == Exit.PEER_LOST, procs.log(role)[-2000:]
    assert "has been silent" in procs.log("server")


@pytest.mark.slow  # fast twins: a worker gone with its coordinator; the launched roles
def test_a_server_and_an_evaluator_started_by_hand_exit_once_their_coordinator_is_gone(
        tmp_path):
    """(Both in one job: a server with no workers yet, and an observer asking the status.)"""
    _plain_and_curve(tmp_path, _server_and_evaluator_lose_their_coordinator)


def _coordinator_loses_its_workers(procs: Procs, tmp_path: Path, curve: bool) -> None:
    _start_job(procs, tmp_path, curve, _job(tmp_path), roles=("server", "worker"))
    _wait_for("training", lambda: _training(tmp_path), procs=procs)
    killed = _kill(procs, "worker")
    _exit_within(procs, "coordinator", 2 * HEARTBEAT_TIMEOUT, killed)
    # Its only worker died, none finished: the job failed, retryable (not counted done).
    assert procs.procs["coordinator"].returncode == Exit.PEER_LOST
    assert "none finished it (1 dead)" in procs.log("coordinator")
    # and the server it leaves behind follows it
    _exit_within(procs, "server", 2 * HEARTBEAT_TIMEOUT + 2 * COORDINATOR_TIMEOUT, killed)


@pytest.mark.slow  # fast twins: a worker gone with its coordinator; the launched roles
def test_a_coordinator_exits_once_all_its_workers_are_gone(tmp_path):
    _plain_and_curve(tmp_path, _coordinator_loses_its_workers)


def test_launched_roles_exit_once_the_coordinator_is_gone(tmp_path):
    """Started by the launcher (ephemeral CURVE keys) and left alone: its children follow a
    dead coordinator by themselves."""
    from paramserver.launch.local import LocalCluster
    job = json.loads(_job(tmp_path).read_text())
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=120)
    try:
        cluster.start()
        events = cluster.run_dir / "events.jsonl"
        _wait_for("training", lambda: events.exists() and '"barrier_open"' in events.read_text())
        time.sleep(0.5)
        coord = cluster.children[0]
        os.kill(coord.proc.pid, signal.SIGKILL)
        coord.proc.wait(10)
        killed = time.monotonic()
        for c in cluster.children[1:]:
            try:
                c.proc.wait(max(0.0, killed + 2 * COORDINATOR_TIMEOUT - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{c.name} outlived the coordinator:\n{c.tail()}") from None
    finally:
        cluster.stop()


FAKE_COORDINATOR = """
import sys
from paramserver.net import rpc
from paramserver.transport import bind_router, new_context, security, terminate
from paramserver.wire import Message
ctx = new_context()
sock, addr = bind_router(ctx, keys=security.load(sys.argv[1], "coordinator"))
print(addr, flush=True)
if sock.poll(30000):
    ident, msg, _ = rpc.recv(sock, routed=True)
    rpc.send(sock, Message("error", {"msg": "refused for the test"}, rid=msg.rid, src="coord"),
             ident)
    sock.poll(2000)
terminate(ctx, (sock,))
"""


def test_a_curve_server_refused_right_after_binding_exits(procs, tmp_path):
    """Its CURVE guard watches its ROUTER through a monitor socket; one left open kept the
    context, and so the process, from ever ending."""
    keys = _keys(tmp_path, True)
    fake = subprocess.Popen([sys.executable, "-c", FAKE_COORDINATOR, keys[1]],
                            stdout=subprocess.PIPE, text=True)
    try:
        addr = fake.stdout.readline().strip()
        server = procs.start("server", ["server", "--join", addr] + keys)
        _exit_within(procs, "server", 20.0, time.monotonic())
        assert server.returncode == Exit.REFUSED, procs.log("server")[-2000:]
        assert "refused for the test" in procs.log("server")
    finally:
        fake.kill()
        fake.wait(10)
        fake.stdout.close()


EARLY_CLOSE = """
import sys
from paramserver.transport import bind_router, new_context, security
ctx = new_context()
for _ in range(3):
    sock, _ = bind_router(ctx, keys=security.load(sys.argv[1], "server"))
    sock.close(0)
ctx.term()
print("terminated")
"""


def test_a_curve_context_closed_right_after_binding_terminates(tmp_path):
    keys = _keys(tmp_path, True)
    out = subprocess.run([sys.executable, "-c", EARLY_CLOSE, keys[1]], capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.strip() == "terminated", out.stderr


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_a_sigkilled_launcher_leaves_its_keys_in_its_run_folder_only(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run_dir = tmp_path / "run"
    env = {**os.environ, "TMPDIR": str(tmp)}
    launcher = subprocess.Popen(
        PY + ["train", "--workers", "2", "--servers", "1", "--device-time", "2ms",
              "--max-seconds", "600", "--eval-interval", "0", "--out", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
    try:
        _wait_for("the coordinator's address", (run_dir / "coordinator.addr").exists)
        _wait_for("the worker's first step",
                  lambda: '"kind": "step"' in _text(run_dir / "metrics.jsonl"), timeout=60)
        # (forked roles name no run folder on their command line: the tree, taken first)
        job = psutil.Process(launcher.pid).children(recursive=True)
    finally:
        launcher.kill()
        launcher.wait(10)
    # Its children die with it (PR_SET_PDEATHSIG, the roles with the zygote, which ends with
    # the launcher), within seconds: the job's roles, each holding the zygote up, trained on.
    assert len(job) >= 5  # the zygote, the coordinator, the server, the workers at least
    left = psutil.wait_procs(job, timeout=8)[1]
    for proc in left:  # (reaped here so that a failure leaves no job behind)
        proc.kill()
    psutil.wait_procs(left, timeout=10)
    assert not left, f"left running after the launcher's death: {left}"
    # Only multiprocessing's folder of the role zygote's socket (launch/zygote.py), which the
    # killed launcher could not remove: no file of the job's, no key.
    left = [p for p in tmp.rglob("*") if not (p.is_dir() and p.name.startswith("pymp-"))
            and not p.is_socket()]
    assert left == [], f"the job left files in TMPDIR: {left}"
    keys = run_dir / "keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    secrets = list((keys / "private").glob("*.key_secret"))
    assert secrets, "no private keys in the run folder"
    for path in secrets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
