"""CURVE on every socket: keys on disk, who gets in, replays, and the bind rule (real processes)."""

from __future__ import annotations

import os
import select
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from ps_helpers import make_job
from paramserver.net import rpc
from paramserver.launch.local import LocalCluster
from paramserver.client.kv import KVWorker
from paramserver.transport import bind_router, connect_dealer, recv_message, security
from paramserver.wire import Message
from paramserver.transport import terminate

N = 64  # keys: small, so one push is one short burst of bytes on the wire
REFUSED_WITHIN = 1.5  # s a refused client waits for its first answer


def paramserver(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "paramserver", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


# ---- keys on disk -------------------------------------------------------------------------------
def test_keys_generate_writes_a_pair_per_role_with_private_modes(tmp_path):
    out = paramserver("keys", "generate", str(tmp_path / "k"))
    assert out.returncode == 0, out.stderr
    root = tmp_path / "k"
    assert stat.S_IMODE((root / "private").stat().st_mode) == 0o700
    for role in security.ROLES:
        pub, sec = root / "public" / f"{role}.key", root / "private" / f"{role}.key_secret"
        assert stat.S_IMODE(sec.stat().st_mode) == 0o600
        assert stat.S_IMODE(pub.stat().st_mode) == 0o644
        assert "secret-key" not in pub.read_text() and "secret-key" in sec.read_text()
        keys = security.load(root, role)  # text certificates zmq reads back
        assert keys.public in keys.allowed and keys.allowed[keys.public] == role
    pairs = {security.load(root, r).secret for r in security.ROLES}
    assert len(pairs) == len(security.ROLES)  # a pair per role, not one shared
    again = paramserver("keys", "generate", str(root))
    assert again.returncode == 2 and "exists already" in again.stderr


def test_keys_generate_into_a_file_says_a_file_is_in_the_way(tmp_path):
    """(It printed '[Errno 20] Not a directory: .../public'.)"""
    (tmp_path / "notes.txt").write_text("a file\n")
    for target in ("notes.txt", "notes.txt/k"):
        out = paramserver("keys", "generate", str(tmp_path / target))
        assert out.returncode == 2, out.stderr
        assert f"{tmp_path / 'notes.txt'} is a file, not a folder; give a new or existing " \
               f"folder" in out.stderr.splitlines()[0], out.stderr


def test_exposed_or_missing_keys_are_clear_errors(tmp_path):
    security.generate(tmp_path / "k")
    secret = tmp_path / "k" / "private" / "worker.key_secret"
    os.chmod(secret, 0o644)
    with pytest.raises(security.SecurityError, match="readable by other users"):
        security.load(tmp_path / "k", "worker")
    with pytest.raises(security.SecurityError, match="no key folder") as missing:
        security.load(tmp_path / "nothing", "worker")
    # A finished local job's RUN/keys is gone: joining it late says that may be why.
    assert "exists only while the job runs" in str(missing.value)
    with pytest.raises(security.SecurityError, match="no key folder") as empty:
        security.load(tmp_path, "worker")  # a folder, not a key folder: no such guess
    assert "while the job runs" not in str(empty.value)
    (tmp_path / "k" / "private" / "server.key_secret").unlink()
    with pytest.raises(security.SecurityError, match="server.key_secret"):
        security.load(tmp_path / "k", "server")


# ---- the bind rule ------------------------------------------------------------------------------
def test_non_loopback_bind_needs_keys_or_insecure(tmp_path, caplog):
    out = paramserver("server", "--join", "tcp://127.0.0.1:9", "--bind", "0.0.0.0", timeout=30)
    assert out.returncode == 2
    assert "refusing to bind 0.0.0.0 without keys" in out.stderr and "--insecure" in out.stderr
    assert "Traceback" not in out.stderr
    ctx = zmq.Context()
    try:
        with pytest.raises(security.SecurityError):
            bind_router(ctx, "0.0.0.0")
        sock, _ = bind_router(ctx, "127.0.0.1")  # loopback stays the plaintext default
        sock.close(0)
        security._WARNED.discard("0.0.0.0")  # warned once per process: not by an earlier test
        with caplog.at_level("WARNING"):
            sock, addr = bind_router(ctx, "0.0.0.0", keys=security.INSECURE,
                                     advertise="127.0.0.1")
        sock.close(0)
        # (a wildcard is no address to dial: the caller says which one, see test_addresses)
        assert addr.startswith("tcp://127.0.0.1:") and "--insecure" in caplog.text
    finally:
        terminate(ctx)  # bounded: a socket left open must not hold the test


# ---- a job with keys ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def secure_job(tmp_path_factory):
    run = tmp_path_factory.mktemp("secure")
    cluster = LocalCluster(make_job(N, 1, 1, sync="asp", lr=1.0, heartbeat_timeout=30.0),
                           run / "run", job_timeout=120)  # keys: ephemeral, the default
    try:
        cluster.start(spawn_workers=False)
        # The job's one worker, never started: it writes and reads the shard directly.
        kv = KVWorker(cluster.address, role="worker", keys=cluster.client_keys("worker"))
        kv.init(np.zeros(N))
        yield cluster, kv
        kv.close()
    finally:
        cluster.stop()


def _log(cluster, role: str) -> str:
    return (cluster.run_dir / "logs" / f"{role}-0.log").read_text(errors="replace")


def _refused(join: str, keys) -> str:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        KVWorker(join, role="observer", keys=keys, timeout=REFUSED_WITHIN, heartbeat=False)
    assert time.monotonic() - t0 < REFUSED_WITHIN + 2.0
    return "refused"


def test_ephemeral_keys_live_in_a_private_folder(secure_job):
    cluster, _ = secure_job
    assert stat.S_IMODE(os.stat(cluster.keys_dir).st_mode) == 0o700


def test_only_holders_of_the_cluster_keys_get_in(secure_job, tmp_path):
    cluster, kv = secure_job
    before = kv.pull()
    stranger = tmp_path / "other"
    security.generate(stranger)
    own = cluster.client_keys("observer")
    pub, sec = zmq.curve_keypair()
    unlisted = security.Keys(own.directory, "observer", pub, sec, own.peers, {})
    # The three at once (each waits out its REFUSED_WITHIN): plaintext, another cluster's
    # keys, and a client that knows the server but whose own key is not on the list.
    with ThreadPoolExecutor(3) as pool:
        waits = [pool.submit(_refused, cluster.address, keys)
                 for keys in (None, security.load(stranger, "observer"), unlisted)]
        for wait in waits:
            wait.result()
    log = _log(cluster, "coordinator")
    assert "CURVE handshake failed" in log
    assert f"its key {pub.decode()} is not in {own.directory}/public" in log
    # Straight to the shard: a plaintext push never reaches the handler.
    ctx = zmq.Context()
    try:
        rogue = connect_dealer(ctx, kv.shards[0].addr)
        rpc.send(rogue, _push(np.full(N, 5.0)))
        assert not rogue.poll(int(REFUSED_WITHIN * 1000))
        rogue.close(0)
    finally:
        terminate(ctx)  # bounded: a socket left open must not hold the test
    np.testing.assert_array_equal(kv.pull(), before)  # nothing the strangers sent arrived
    kv.push(np.ones(N), step=0, batch=1)  # the keyed client can
    np.testing.assert_array_equal(kv.pull(), before - 1.0)


# ---- replays ------------------------------------------------------------------------------------
class Tap:
    """A TCP proxy that records what the client sends, in the pieces it arrived in."""

    def __init__(self, upstream: str):
        host, port = upstream[len("tcp://"):].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent: list[bytes] = []
        self.up: socket.socket | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        client, _ = self.listener.accept()
        self.up = socket.create_connection(self.upstream)
        peers = {client: self.up, self.up: client}
        while not self.stop.is_set():
            ready, _, _ = select.select(list(peers), [], [], 0.05)
            for s in ready:
                data = s.recv(1 << 16)
                if not data:
                    return
                if s is client:
                    self.sent.append(data)
                peers[s].sendall(data)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


def _push(grad: np.ndarray, rid: int = 1) -> Message:
    return Message("push", {"range": [0, N], "step": 0, "version": 0, "batch": 1},
                   [grad], rid=rid, src="tap")


def _replay(sock: socket.socket, pieces: list[bytes]) -> bool:
    """Send the pieces as the client did (libzmq wants a greeting's parts apart); True when
    the server hung up on them."""
    try:
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.05)
    except (BrokenPipeError, ConnectionResetError):
        return True
    return False


def _hung_up(sock: socket.socket, within: float = 0.5) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(1 << 16):
            pass
        return True  # end of stream: the server closed the connection
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def _replay_twice(shard: str, keys) -> bool:
    """One push through the tap; its bytes again in the same session, then the whole session
    on a fresh connection. Returns whether the server hung up on the second replay."""
    ctx = zmq.Context()
    tap = Tap(shard)
    try:
        sock = connect_dealer(ctx, tap.address, keys=keys, peer="server")
        rpc.send(sock, Message("pull", {"range": [0, N]}, rid=1, src="tap"))
        assert sock.poll(10_000), "no answer through the tap"
        rpc.recv(sock, routed=False)
        mark = len(tap.sent)  # the handshake and one request are behind us
        rpc.send(sock, _push(np.full(N, 2.0), rid=2))
        assert sock.poll(10_000), "the push was not acknowledged"
        rpc.recv(sock, routed=False)
        _replay(tap.up, tap.sent[mark:])
        time.sleep(0.3)
        sock.close(0)
        with socket.create_connection(tap.upstream) as fresh:
            return _replay(fresh, tap.sent) or _hung_up(fresh)
    finally:
        tap.close()
        terminate(ctx)  # bounded: a socket left open must not hold the test


def _duplicates(shard: str, keys) -> int:
    """Pushes the shard answered from its dedup table: replays that reached its handler."""
    ctx = zmq.Context()
    try:
        sock = connect_dealer(ctx, shard, keys=keys, peer="server")
        rpc.send(sock, Message("status", rid=1, src="probe"))
        assert sock.poll(10_000), "the shard did not answer status"
        _, reply, _ = rpc.recv(sock, routed=False)
        sock.close(0)
        return reply["state"]["duplicates"]
    finally:
        terminate(ctx)  # bounded: a socket left open must not hold the test


def test_a_captured_push_replayed_is_rejected(secure_job):
    cluster, kv = secure_job
    before = kv.pull()
    assert _replay_twice(kv.shards[0].addr, cluster.client_keys("worker"))  # a new session
    # Within the session the repeated nonce gives it away; libzmq drops the message.
    assert "CURVE handshake failed (zmtp_invalid_sequence)" in _log(cluster, "server")
    # Applied once (lr 1), and the replays reached no handler (not even the dedup table's).
    np.testing.assert_array_equal(kv.pull(), before - 2.0)
    assert _duplicates(kv.shards[0].addr, cluster.client_keys("worker")) == 0


def test_without_curve_the_same_replay_reaches_the_handler(tmp_path):
    """The control: without CURVE the replays do reach the handler; only the exactly-once
    table (same sender, same request id) keeps them from being applied again."""
    cluster = LocalCluster(make_job(N, 1, 1, sync="asp", lr=1.0), tmp_path / "run",
                           job_timeout=120, keys=None)
    try:
        cluster.start(spawn_workers=False)
        kv = KVWorker(cluster.address, role="observer", shared_memory=False)
        try:
            kv.init(np.zeros(N))
            assert not _replay_twice(kv.shards[0].addr, None)
            np.testing.assert_array_equal(kv.pull(), np.full(N, -2.0))  # applied once
            assert _duplicates(kv.shards[0].addr, None) == 2  # both replays answered
        finally:
            kv.close()
    finally:
        cluster.stop()


# ---- a key acts in its own role only ------------------------------------------------------------
def _ask_coordinator(cluster, keys, msg: Message) -> Message:
    """One request to the job's coordinator and its answer; `keys`: a role name or Keys."""
    ctx = zmq.Context()
    try:
        keys = cluster.client_keys(keys) if isinstance(keys, str) else keys
        sock = connect_dealer(ctx, cluster.address, keys=keys)
        rpc.send(sock, msg)
        assert sock.poll(10_000), f"the coordinator did not answer {msg.op}"
        _, reply, _ = rpc.recv(sock, routed=False)
        sock.close(0)
        return reply
    finally:
        terminate(ctx)  # bounded: a socket left open must not hold the test


def test_a_worker_key_cannot_register_or_speak_as_a_server(secure_job):
    cluster, kv = secure_job
    fake = Message("register", {"role": "server", "addr": "tcp://127.0.0.1:9"}, rid=1, src="x")
    reply = _ask_coordinator(cluster, "worker", fake)
    assert reply.op == "error"
    assert "a key filed as worker cannot act in the server role" in reply["msg"]
    # Nor may it speak for the registered shard: its counters would land in the job's metrics.
    beat = Message("heartbeat", {"counters": {"late_pushes": 99, "duplicates": 0}}, rid=2,
                   src="s0")
    reply = _ask_coordinator(cluster, "worker", beat)
    assert reply.op == "error" and "cannot act in the server role" in reply["msg"]
    # Nor take a server's name as a worker, which would turn its messages into the server's.
    taken = Message("register", {"role": "worker"}, rid=4, src="s0")
    reply = _ask_coordinator(cluster, "worker", taken)
    assert reply.op == "error" and "a server's name" in reply["msg"]
    fake_restore = Message("restored", {"tag": "t", "lost_updates": 5, "version": 0}, rid=5,
                           src="s0")
    reply = _ask_coordinator(cluster, "worker", fake_restore)
    assert reply.op == "error" and "cannot act in the server role" in reply["msg"]
    # Metrics come from registered workers and observers only.
    junk = Message("report", {"record": {"kind": "eval", "test_accuracy": 1.0}}, rid=6,
                   src="nobody")
    reply = _ask_coordinator(cluster, "server", junk)
    assert reply.op == "error" and "no registered worker or observer" in reply["msg"]
    state = _ask_coordinator(cluster, "observer", Message("status", rid=3, src="probe"))
    assert [s["addr"] for s in state["state"]["servers"].values()] == [kv.shards[0].addr]


def test_a_key_is_named_by_its_file_up_to_the_first_dash(tmp_path):
    security.generate(tmp_path)
    # A second worker key, for another host: filed as worker-hostB, it is a worker key.
    security.generate(tmp_path, ["worker-hostB"])
    host_b = security.load(tmp_path, "worker", "worker-hostB")
    assert host_b.public != security.load(tmp_path, "worker").public
    ctx = zmq.Context()
    try:
        router, addr = bind_router(ctx, "127.0.0.1", 0,
                                   keys=security.load(tmp_path, "coordinator"))
        roles = []
        for keys in (host_b, security.load(tmp_path, "observer")):
            dealer = connect_dealer(ctx, addr, keys=keys)
            dealer.send(b"hello")
            assert router.poll(10_000), "the keyed client was not admitted"
            peer, _ = recv_message(router, routed=True)  # the role rides on the routing id
            roles.append(peer.key_role)
            dealer.close(0)
        plain, plain_addr = bind_router(ctx, "127.0.0.1", 0, keys=None)
        dealer = connect_dealer(ctx, plain_addr, keys=None)
        dealer.send(b"hello")
        assert plain.poll(10_000)
        roles.append(recv_message(plain, routed=True)[0].key_role)
        dealer.close(0)
        router.close(0)
        plain.close(0)
    finally:
        terminate(ctx)  # bounded: a socket left open must not hold the test
    assert roles == ["worker", "observer", None]
    with pytest.raises(ValueError, match="filed as worker cannot act in the server role"):
        security.check_role(SimpleNamespace(key_role="worker"), "server")
    with pytest.raises(ValueError, match="key has no role"):  # under CURVE: fails closed
        security.check_role(SimpleNamespace(key_role=None), "server")
    security.check_role(SimpleNamespace(key_role=None), "server", secured=False)  # plaintext


def test_more_keys_of_a_role_by_name_and_clear_errors(tmp_path, monkeypatch):
    root = tmp_path / "k"
    assert paramserver("keys", "generate", str(root)).returncode == 0
    out = paramserver("keys", "generate", str(root), "--name", "worker-hostB", "--name",
                      "worker-hostC")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (root / "public").glob("worker*")) == [
        "worker-hostB.key", "worker-hostC.key", "worker.key"]
    assert stat.S_IMODE((root / "private" / "worker-hostC.key_secret").stat().st_mode) == 0o600
    keys = security.load(root, "worker", "worker-hostC")
    assert keys.allowed[keys.public] == "worker-hostC"
    for bad in ("hacker", "worker/../x", "-worker", "", "worker-..", "worker-.", "worker-a.key",
                "server-hostA", "coordinator-2", "Worker"):
        out = paramserver("keys", "generate", str(root), f"--name={bad}")
        assert out.returncode == 2 and "bad key name" in out.stderr, (bad, out.stderr)
    out = paramserver("keys", "generate", str(root), "--name", "worker-x", "--name", "worker-x")
    assert out.returncode == 2 and "given twice" in out.stderr
    out = paramserver("worker", "--join", "tcp://127.0.0.1:9", "--key-name", "worker-hostB",
                      env={k: v for k, v in os.environ.items() if k != security.ENV}, timeout=30)
    assert out.returncode == 2 and "--key-name needs --keys" in out.stderr
    with pytest.raises(security.SecurityError, match="'observer' is not a worker key"):
        security.load(root, "worker", "observer")
    out = paramserver("worker", "--join", "tcp://127.0.0.1:9", "--keys", str(root),
                      "--key-name", "server", timeout=30)
    assert out.returncode == 2 and "is not a worker key" in out.stderr
    assert "Traceback" not in out.stderr
    # $PARAMSERVER_KEY_NAME picks the pair of processes of its role, and no other role's.
    monkeypatch.setenv(security.ENV, str(root))
    monkeypatch.setenv(security.NAME_ENV, "worker-hostB")
    assert security.from_env("worker").public == security.load(root, "worker",
                                                               "worker-hostB").public
    assert security.from_env("observer").public == security.load(root, "observer").public


def test_a_host_key_joins_in_its_role_and_no_other(tmp_path):
    keys_dir = tmp_path / "k"
    security.generate(keys_dir)
    security.generate(keys_dir, ["worker-hostB", "observer-laptop"])
    # A pair filed by hand under a name `generate` refuses: admitted, but it acts in no role.
    zmq.auth.create_certificates(keys_dir / "private", "server-x")
    os.replace(keys_dir / "private" / "server-x.key", keys_dir / "public" / "server-x.key")
    pub, sec = zmq.auth.load_certificate(keys_dir / "private" / "server-x.key_secret")
    own = security.load(keys_dir, "server")
    rogue = security.Keys(own.directory, "server", pub, sec, own.peers, own.allowed)
    cluster = LocalCluster(make_job(N, 1, 1, sync="asp", lr=1.0), tmp_path / "run",
                           keys=keys_dir, job_timeout=120)
    try:
        cluster.start(spawn_workers=False)
        reply = _ask_coordinator(cluster, rogue, Message(
            "register", {"role": "server", "addr": "tcp://127.0.0.1:9"}, rid=1, src="x"))
        assert reply.op == "error" and "the sender's key has no role" in reply["msg"]
        host_b = KVWorker(cluster.address, role="worker",
                          keys=security.load(keys_dir, "worker", "worker-hostB"))
        host_b.init(np.arange(N, dtype=np.float64))
        laptop = KVWorker(cluster.address, role="observer",
                          keys=security.load(keys_dir, "observer", "observer-laptop"))
        np.testing.assert_array_equal(laptop.pull(), np.arange(N))
        # An evaluator's key reads; writing to a shard takes a worker's.
        for write in (lambda: laptop.push(np.ones(N), step=0, batch=1),
                      lambda: laptop.push_sparse(np.array([1, 2]), np.ones(2), step=0, batch=1),
                      lambda: laptop.init(np.zeros(N))):
            with pytest.raises(rpc.RemoteError, match="filed as observer cannot act in the work"):
                write()
        np.testing.assert_array_equal(laptop.pull(), np.arange(N))
        host_b.push(np.ones(N), step=0, batch=1)
        np.testing.assert_array_equal(laptop.pull(), np.arange(N) - 1.0)
        laptop.close()
        host_b.close()
        with pytest.raises(rpc.RemoteError, match="filed as worker cannot act in the observer"):
            KVWorker(cluster.address, role="observer", keys=security.load(keys_dir, "worker"),
                     heartbeat=False)
    finally:
        cluster.stop()


def test_one_key_filed_twice_is_refused(tmp_path):
    security.generate(tmp_path)
    # Under two names, which role would the key act in? The folder is refused instead.
    (tmp_path / "public" / "observer-copy.key").write_bytes(
        (tmp_path / "public" / "worker.key").read_bytes())
    with pytest.raises(security.SecurityError, match="holds the same key as"):
        security.load(tmp_path, "worker")


def test_keys_list_shows_roles_and_problems(tmp_path):
    root = tmp_path / "k"
    security.generate(root)
    security.generate(root, ["worker-hostB"])
    clean = paramserver("keys", "list", str(root))
    assert clean.returncode == 0, clean.stderr
    rows = {line.split()[0]: line.split()[1:] for line in clean.stdout.splitlines()[1:]}
    assert rows["worker-hostB"] == ["worker", "here", "(600)"]
    assert rows["coordinator"][0] == "coordinator" and len(rows) == 5
    # One key under two names, and a private key others can read: both named, exit 1.
    dup = (root / "public" / "worker.key").read_bytes()
    (root / "public" / "observer-dup.key").write_bytes(dup)
    os.chmod(root / "private" / "server.key_secret", 0o644)
    bad = paramserver("keys", "list", str(root))
    assert bad.returncode == 1 and "same key as observer-dup" in bad.stdout
    assert "readable by others (mode 644)" in bad.stdout
    assert "two files hold one key" in bad.stderr and "chmod 600" in bad.stderr
    # A readable private key alone is explained as that, not as a key filed twice.
    (root / "public" / "observer-dup.key").unlink()
    readable = paramserver("keys", "list", str(root))
    assert readable.returncode == 1
    assert readable.stderr.strip() == ("1 key(s) with a problem: a process refuses a private "
                                       "key others can read (chmod 600 it)")
    missing = paramserver("keys", "list", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no key folder" in missing.stderr
