"""CURVE for ZeroMQ sockets: a cluster's key folder, secured sockets, a guard that vets peers.

Key folder (`paramserver keys generate DIR`)::

    DIR/public/<role>.key            public keys (0644): the allow-list every ROUTER checks
    DIR/private/<role>.key_secret    key pairs (0600, folder 0700): one per role

A process of role R needs `private/R.key_secret` and `public/` (the ROUTER roles' public keys
tell its clients whom they talk to; every key in `public/` may connect). ROUTERs run CURVE as
the server with their role's pair; a ZAP handler (one thread per context, `_Guard`) admits only
clients whose public key is in `public/` and logs the others, as it logs failed handshakes
(wrong server key, no CURVE, a replayed session). See docs/security.md.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import monitor, z85

log = logging.getLogger(__name__)

ROLES = ("coordinator", "server", "worker", "observer")
ROUTER_ROLES = ("coordinator", "server")  # roles that bind: their public keys are dialled
ENV = "PARAMSERVER_KEYS"  # a key folder for processes started without --keys


class SecurityError(ValueError):
    """Missing, malformed or exposed keys, or an unsafe bind."""


@dataclass(frozen=True)
class Keys:
    """One process's view of a cluster's keys: its own pair, its servers', the allow-list."""

    directory: str
    role: str
    public: bytes  # z85
    secret: bytes
    peers: dict  # router role -> its public key (z85)
    allowed: dict  # z85 public key -> the role name it was filed under (for logs)


class _Insecure:
    """Plaintext, and explicitly allowed off loopback (`--insecure`)."""

    def __repr__(self) -> str:
        return "INSECURE"


INSECURE = _Insecure()


# ---- key files ----------------------------------------------------------------------------------
def generate(directory: str | os.PathLike, roles=ROLES) -> list[Path]:
    """Write a key pair per role into `directory`; refuses to overwrite existing keys."""
    root = Path(directory)
    public, private = root / "public", root / "private"
    clashes = [p for r in roles for p in (public / f"{r}.key", private / f"{r}.key_secret")
               if p.exists()]
    if clashes:
        raise SecurityError(f"{clashes[0]} exists already; remove the old keys first")
    public.mkdir(parents=True, exist_ok=True)
    private.mkdir(parents=True, exist_ok=True)
    os.chmod(private, 0o700)
    written = []
    old = os.umask(0o077)  # the secret file is private from its first byte
    try:
        for role in roles:
            pub, sec = zmq.auth.create_certificates(private, role)
            os.replace(pub, public / f"{role}.key")
            os.chmod(public / f"{role}.key", 0o644)
            os.chmod(sec, 0o600)
            written += [public / f"{role}.key", Path(sec)]
    finally:
        os.umask(old)
    return written


def _load_public(path: Path) -> bytes:
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read public key {path}: {exc}") from None
    if not public or len(public) != 40:
        raise SecurityError(f"{path} holds no CURVE public key")
    return public


def _load_secret(path: Path) -> tuple[bytes, bytes]:
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise SecurityError(f"cannot read secret key {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise SecurityError(f"{path} is readable by other users (mode {mode & 0o777:o}); "
                            f"chmod 600 it")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read secret key {path}: {exc}") from None
    if not secret or len(secret) != 40 or len(public or b"") != 40:
        raise SecurityError(f"{path} holds no CURVE key pair")
    return public, secret


def load(directory: str | os.PathLike, role: str) -> Keys:
    """The keys a process of `role` uses, from a folder written by `generate`."""
    if role not in ROLES:
        raise SecurityError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    root = Path(directory)
    if not (root / "public").is_dir():
        raise SecurityError(f"{root} is no key folder (no public/ inside); create one with "
                            f"`paramserver keys generate {root}`")
    public, secret = _load_secret(root / "private" / f"{role}.key_secret")
    peers = {r: _load_public(root / "public" / f"{r}.key") for r in ROUTER_ROLES}
    allowed = {_load_public(p): p.stem for p in sorted((root / "public").glob("*.key"))}
    return Keys(str(root), role, public, secret, peers, allowed)


def from_env(role: str) -> Keys | None:
    """Keys from the folder named by $PARAMSERVER_KEYS, or None when it is not set."""
    directory = os.environ.get(ENV)
    return load(directory, role) if directory else None


# ---- sockets ------------------------------------------------------------------------------------
def _loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1")


_WARNED: set[str] = set()  # hosts warned about in this process


def check_bind(host: str, scheme: str, keys) -> None:
    """Refuse plaintext off loopback unless asked for; warn when asked for."""
    if keys is not None and keys is not INSECURE or scheme != "tcp" or _loopback(host):
        return
    if keys is INSECURE:
        if host not in _WARNED:  # (the CLI checks before binding, bind_router again)
            _WARNED.add(host)
            log.warning("binding %s without keys (--insecure): anyone who can reach this port "
                        "can push, pull and read the traffic", host)
        return
    raise SecurityError(f"refusing to bind {host} without keys: anyone who can reach it could "
                        f"push and pull. Give --keys DIR (see `paramserver keys generate`), or "
                        f"--insecure to accept that on a trusted network")


def secure_router(sock: zmq.Socket, keys) -> None:
    """Make a not yet bound ROUTER a CURVE server whose clients the context's guard vets."""
    if not isinstance(keys, Keys):
        return
    domain = _guard(sock.context).admit(keys)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    _guard(sock.context).watch(sock)


def secure_dealer(sock: zmq.Socket, keys, peer: str) -> None:
    """Make a not yet connected DEALER a CURVE client of a ROUTER of role `peer`."""
    if not isinstance(keys, Keys):
        return
    if peer not in keys.peers:
        raise SecurityError(f"no public key for peer role {peer!r}; known: {list(keys.peers)}")
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.peers[peer]


def key_role(frame) -> str | None:
    """The role of the key that sent `frame` (a zmq.Frame from a CURVE ROUTER), None on a
    plaintext socket. The guard names an admitted key by its file in `public/`; the role is that
    name up to its first '-', so `worker-hostB.key` is another worker key."""
    try:
        name = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError):  # plaintext: no ZAP ran, or not a zmq frame
        return None
    return name.split("-", 1)[0] if name else None


def check_role(key: str | None, claimed: str) -> None:
    """Refuse a peer that acts in a role its key was not filed under (a worker key registering
    as a server would be handed every gradient of its shard). None: plaintext, nothing to check."""
    if key is not None and key != claimed:
        raise ValueError(f"a {key} key cannot act as a {claimed}: a {claimed} needs a key filed as "
                         f"public/{claimed}.key or public/{claimed}-*.key")


# ---- the guard: ZAP answers and handshake failures -----------------------------------------------
_GUARDS: "weakref.WeakKeyDictionary[zmq.Context, _Guard]" = weakref.WeakKeyDictionary()
_GUARDS_LOCK = threading.Lock()
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_PROTOCOL_ERRORS = {int(getattr(zmq, n)): n[len("PROTOCOL_ERROR_"):].lower()
                    for n in dir(zmq) if n.startswith("PROTOCOL_ERROR_")}


def _guard(ctx: zmq.Context) -> "_Guard":
    with _GUARDS_LOCK:
        guard = _GUARDS.get(ctx)
        if guard is None:
            guard = _GUARDS[ctx] = _Guard(ctx)
            guard.start()
        return guard


class _Throttle:
    """Log a repeated refusal at most once per `every` seconds (a peer retrying its connection
    every 100 ms must not flood the log), saying how many were not logged."""

    def __init__(self, every: float = 5.0):
        self.every, self.last, self.quiet = every, {}, {}

    def __call__(self, key, fmt: str, *args) -> None:
        now = time.monotonic()
        if now - self.last.get(key, -1e9) < self.every:
            self.quiet[key] = self.quiet.get(key, 0) + 1
            return
        self.last[key] = now
        more = self.quiet.pop(key, 0)
        log.warning(fmt + (f" ({more} more like it not logged)" if more else ""), *args)


class _Guard(threading.Thread):
    """Per context: answers ZAP requests and reports failed handshakes of watched ROUTERs."""

    def __init__(self, ctx: zmq.Context):
        super().__init__(daemon=True, name="paramserver-zap")
        self.zap = ctx.socket(zmq.REP)
        self.zap.linger = 0
        self.zap.bind("inproc://zeromq.zap.01")
        self.domains: dict[str, Keys] = {}
        self.incoming: queue.SimpleQueue = queue.SimpleQueue()
        self.refused = _Throttle()

    def admit(self, keys: Keys) -> str:
        domain = f"paramserver-{len(self.domains)}"
        self.domains[domain] = keys
        return domain

    def watch(self, sock: zmq.Socket) -> None:
        self.incoming.put(sock.get_monitor_socket(_FAILED))

    def run(self) -> None:
        poller, monitors = zmq.Poller(), []
        poller.register(self.zap, zmq.POLLIN)
        try:
            while True:
                while not self.incoming.empty():
                    monitors.append(self.incoming.get())
                    poller.register(monitors[-1], zmq.POLLIN)
                ready = dict(poller.poll(200))
                if self.zap in ready:
                    self.zap.send_multipart(self._answer(self.zap.recv_multipart()))
                for m in monitors:
                    if m in ready:
                        self._report(monitor.recv_monitor_message(m))
        except zmq.ZMQError:  # the context is terminating: let it
            pass
        finally:
            for s in (self.zap, *monitors):
                s.close(0)

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, rid, domain, address, _identity, mechanism = frames[:6]
        keys = self.domains.get(domain.decode(errors="replace"))
        key = z85.encode(frames[6]) if mechanism == b"CURVE" and len(frames) > 6 else None
        if keys is not None and key in keys.allowed:
            name = keys.allowed[key]
            log.debug("admitted %s (%s key)", address.decode(errors="replace"), name)
            return [version, rid, b"200", b"OK", name.encode(), b""]
        self.refused(("zap", address), "refused a connection from %s: its key %s is not in %s",
                     address.decode(errors="replace"),
                     key.decode() if key else mechanism.decode(errors="replace"),
                     f"{keys.directory}/public" if keys else "any key folder")
        return [version, rid, b"400", b"key not allowed", b"", b""]

    def _report(self, event: dict) -> None:
        reason = "no detail"  # NO_DETAIL events carry an errno, PROTOCOL ones the reason
        if event.get("event") == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            reason = _PROTOCOL_ERRORS.get(int(event.get("value", 0)), "protocol error")
        endpoint = event.get("endpoint", b"")
        self.refused(("handshake", reason),
                     "refused a connection on %s: CURVE handshake failed (%s): a peer without "
                     "this cluster's server key, not using CURVE, or replaying a session",
                     endpoint.decode(errors="replace") if isinstance(endpoint, bytes)
                     else endpoint, reason)
