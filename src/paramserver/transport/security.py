"""CURVE for ZeroMQ sockets: a cluster's key folder, secured sockets, a guard that vets peers.

Key folder (`paramserver keys generate DIR`)::

    DIR/public/<name>.key            public keys (0644): the allow-list every ROUTER checks
    DIR/private/<name>.key_secret    key pairs (0600, folder 0700): one per role, and more

A key's name is its role (`worker`), or for workers and observers also the role, a dash and a
suffix (`worker-hostB`: one more worker key, so that one host's key can be revoked alone); it
may act in that role only.

A process of role R needs `private/R.key_secret` (or another R key) and `public/` (the ROUTER
roles' public keys tell its clients whom they talk to; every key in `public/` may connect).
ROUTERs run CURVE as the server with their role's pair; a ZAP handler (one thread per context,
`curve_guard`) admits only clients whose public key is in `public/` and logs the others, as it
logs failed handshakes (wrong server key, no CURVE, a replayed session). See docs/security.md.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from paramserver.transport.curve_guard import guard_of

log = logging.getLogger(__name__)

# CURVE wraps each frame in a MESSAGE command (its name, a nonce, a 16-byte box and a flags
# byte): a ROUTER's MAXMSGSIZE counts them, so a frame this much below the bound is the largest
# that passes (measured: at 131,072, frames of 131,039 bytes pass and 131,040 disconnect).
CURVE_FRAME_BYTES = 33
ROLES = ("coordinator", "server", "worker", "observer")
ROUTER_ROLES = ("coordinator", "server")  # roles that bind: their public keys are dialled
ENV = "PARAMSERVER_KEYS"  # a key folder for processes started without --keys
NAME_ENV = "PARAMSERVER_KEY_NAME"  # which key of the folder, for processes of its role
_NAME = re.compile(r"[a-z]+(-[A-Za-z0-9_][A-Za-z0-9_.-]*)?")


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
    allowed: dict  # z85 public key -> its file's name, whose role it may act in (role_of)


class _Insecure:
    """Plaintext, and explicitly allowed off loopback (`--insecure`)."""

    def __repr__(self) -> str:
        return "INSECURE"


INSECURE = _Insecure()


# ---- key files ----------------------------------------------------------------------------------
def role_of(name: str) -> str:
    """The role a key of this name may act in: the name up to its first '-'."""
    return name.split("-", 1)[0]


def check_name(name: str) -> str:
    """`name` if it names a key of a known role (`worker`, `worker-hostB`); else SecurityError.

    Coordinator and server keys have one name each: every client pins that public key, so a
    second one would serve no one."""
    if (not _NAME.fullmatch(name) or role_of(name) not in ROLES or ".." in name
            or name.endswith((".key", ".key_secret"))):
        raise SecurityError(f"bad key name {name!r}: a role ({', '.join(ROLES)}), or a worker or "
                            f"observer role, '-' and letters, digits, '_', '.' or '-' "
                            f"(worker-hostB)")
    if role_of(name) in ROUTER_ROLES and name != role_of(name):
        raise SecurityError(f"bad key name {name!r}: clients pin the {role_of(name)}'s one "
                            f"public key ({role_of(name)}.key), so there are no others")
    return name


def generate(directory: str | os.PathLike, roles=ROLES) -> list[Path]:
    """Write a key pair per name in `roles` (by default one per role) into `directory`; refuses
    to overwrite existing keys."""
    for name in roles:
        check_name(name)
    if len(set(roles)) != len(roles):
        raise SecurityError(f"a key name is given twice: {sorted(roles)}")
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


def load_public(path: Path) -> bytes:
    """The z85 public key in a certificate file; SecurityError if there is none."""
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


def load(directory: str | os.PathLike, role: str, name: str | None = None) -> Keys:
    """The keys a process of `role` uses, from a folder written by `generate`: its own pair is
    `private/<name>.key_secret`, by default the role's."""
    if role not in ROLES:
        raise SecurityError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    name = check_name(name or role)
    if role_of(name) != role:
        raise SecurityError(f"key {name!r} is not a {role} key: its name must be {role}"
                            + ("" if role in ROUTER_ROLES else f" or {role}-SUFFIX"))
    root = Path(directory)
    if not (root / "public").is_dir():
        # A local job's RUN/keys is removed when the job ends: joining it late lands here.
        gone = "" if root.exists() else (" (a local job's RUN/keys exists only while the job "
                                         "runs: has it ended?)")
        raise SecurityError(f"{root} is no key folder (no public/ inside){gone}; create one "
                            f"with `paramserver keys generate {root}`")
    public, secret = _load_secret(root / "private" / f"{name}.key_secret")
    peers = {r: load_public(root / "public" / f"{r}.key") for r in ROUTER_ROLES}
    allowed: dict[bytes, str] = {}
    for path in sorted((root / "public").glob("*.key")):
        key = load_public(path)
        if key in allowed:  # which name, and so which role, would it act in?
            raise SecurityError(f"{path} holds the same key as {allowed[key]}.key: remove one")
        allowed[key] = path.stem
    return Keys(str(root), role, public, secret, peers, allowed)


def from_env(role: str) -> Keys | None:
    """Keys from the folder named by $PARAMSERVER_KEYS, or None when it is not set; the pair
    named by $PARAMSERVER_KEY_NAME when that is a key of `role` (a host's own worker key, say),
    else the role's."""
    directory = os.environ.get(ENV)
    return load(directory, role, env_name(role)) if directory else None


def env_name(role: str) -> str | None:
    """$PARAMSERVER_KEY_NAME when it names a key of `role`: one variable may be set for every
    process of a host, and processes of other roles keep their role's key."""
    name = os.environ.get(NAME_ENV)
    return name if name and role_of(name) == role else None


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
    domain = guard_of(sock.context).admit(keys)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    guard_of(sock.context).watch(sock)


def secure_dealer(sock: zmq.Socket, keys, peer: str) -> None:
    """Make a not yet connected DEALER a CURVE client of a ROUTER of role `peer`."""
    if not isinstance(keys, Keys):
        return
    if peer not in keys.peers:
        raise SecurityError(f"no public key for peer role {peer!r}; known: {list(keys.peers)}")
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.peers[peer]


def key_role(frame: zmq.Frame) -> str | None:
    """The role of the key that sent `frame` (received on a CURVE ROUTER), None on a plaintext
    socket. The guard names an admitted key by its file in `public/`; the role is that name up
    to its first '-', so `worker-hostB.key` is another worker key. Read it from the routing-id
    frame (transport.Peer): body frames may come from the peer's own shared memory."""
    try:
        name = frame.get("User-Id")
    except zmq.ZMQError:  # plaintext: no ZAP ran
        return None
    return _valid_role(name)


@functools.lru_cache(maxsize=256)
def _valid_role(name: str) -> str | None:
    """role_of(name) for a valid key name, else None; cached: it runs for every push."""
    try:
        return role_of(check_name(name))
    except SecurityError:  # a file put in public/ by hand under a name no role owns
        return None


def check_role(peer, claimed: str, secured: bool = True) -> None:
    """Refuse a peer (a transport.Peer) that acts in a role its key was not filed under: a
    worker key registering as a server would be handed every gradient of its shard. Nothing to
    check when the socket is not `secured` (plaintext); a secured peer without a role fails."""
    if not secured:
        return
    key = getattr(peer, "key_role", None)  # plain bytes: no role known, fail closed
    if key is None:  # a badly named key, or never expected under CURVE: fail closed
        raise ValueError(f"the sender's key has no role; acting as {claimed} needs a "
                         f"{claimed} key")
    if key != claimed:
        raise ValueError(f"a key filed as {key} cannot act in the {claimed} role (that needs "
                         f"a {claimed} key)")
