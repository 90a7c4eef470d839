"""The shared-memory transport's own frames, parsed into typed values or refused.

Every hello of the handshake and every by-reference descriptor passes through one parser here
before any of its numbers is used: a frame parses into a frozen value whose every field is an
integer or string in range, or raises ShmFrameError naming the fault. The host token the
handshake checks can be computed by any process on the host, so these frames are as untrusted
as the protocol's own. (JSON, not msgpack: the protocol's codec never sees these frames.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from paramserver.core.words import shown

HEADER_BYTES = 4096  # an arena's first page: release counters, one uint64 per slot
SLOTS = HEADER_BYTES // 8
MAX_BODY_BYTES = 4096  # a hello or descriptor is a few hundred bytes
MAX_ARENA_BYTES = 1 << 48  # beyond any machine's memory; attach also checks the file's size
MAX_PID = 1 << 22  # Linux's pid_max ceiling
MAX_FD = 1 << 20
MAX_SEQ = 1 << 62
MAX_HOST_CHARS = 256


class ShmFrameError(ValueError):
    """A shared-memory transport frame that does not parse; the text says what is wrong.
    `peer` is the sender's routing id where a ROUTER received it (set by the receiver)."""

    peer: bytes | None = None


@dataclass(frozen=True)
class ArenaDesc:
    """Where a peer's arena can be mapped from: /proc/PID/fd/FD, SIZE bytes, on host HOST."""

    host: str
    pid: int
    fd: int
    size: int

    def to_dict(self) -> dict:
        return {"host": self.host, "pid": self.pid, "fd": self.fd, "size": self.size}


@dataclass(frozen=True)
class Offer:
    """DEALER -> ROUTER: map my arena; publish your releases of my frames in counter `slot`."""

    arena: ArenaDesc | None
    slot: int


@dataclass(frozen=True)
class Answer:
    """ROUTER -> DEALER: whether it mapped the DEALER's arena, and its own arena if it has one."""

    attached: bool
    arena: ArenaDesc | None


@dataclass(frozen=True)
class Confirm:
    """DEALER -> ROUTER: whether the DEALER mapped the ROUTER's arena."""

    mapped: bool


@dataclass(frozen=True)
class Refs:
    """Frames sent by reference: (frame index, offset in the sender's arena, length) each, and
    the sender's sequence number (0 from a DEALER)."""

    seq: int
    refs: tuple[tuple[int, int, int], ...]


def _refuse_constant(name: str):
    raise ShmFrameError(f"{name} is not a number this transport accepts")


def _json(body: bytes, what: str):
    if len(body) > MAX_BODY_BYTES:
        raise ShmFrameError(f"{what} of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except ShmFrameError:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise ShmFrameError(f"{what} is not valid JSON: {type(exc).__name__}") from None


def _int(info: dict, name: str, lo: int, hi: int, what: str) -> int:
    value = info.get(name)
    if type(value) is not int or not lo <= value <= hi:
        raise ShmFrameError(f"{what} field {name!r} must be an integer in [{lo}, {hi}], "
                            f"got {_show(value)}")
    return value


def _bool(info: dict, name: str, what: str) -> bool:
    value = info.get(name, False)
    if type(value) is not bool:
        raise ShmFrameError(f"{what} field {name!r} must be true or false, got {_show(value)}")
    return value


def _show(value) -> str:
    return shown(value, 40)


def _map(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise ShmFrameError(f"{what} is not a map")
    return value


def parse_arena(value) -> ArenaDesc:
    info = _map(value, "arena description")
    host = info.get("host")
    if not isinstance(host, str) or not 0 < len(host) <= MAX_HOST_CHARS:
        raise ShmFrameError(f"arena field 'host' must be a non-empty string of at most "
                            f"{MAX_HOST_CHARS} characters")
    return ArenaDesc(host, _int(info, "pid", 1, MAX_PID, "arena"),
                     _int(info, "fd", 0, MAX_FD, "arena"),
                     _int(info, "size", HEADER_BYTES, MAX_ARENA_BYTES, "arena"))


def parse_to_router(body: bytes) -> Offer | Confirm:
    """A hello a ROUTER receives: a DEALER's offer, or its confirmation of our arena."""
    info = _map(_json(body, "shared-memory hello"), "shared-memory hello")
    if "confirm" in info:
        return Confirm(_bool(info, "confirm", "hello"))
    arena = info.get("arena")
    return Offer(None if arena is None else parse_arena(arena),
                 _int(info, "slot", 0, SLOTS - 1, "hello"))


def parse_to_dealer(body: bytes) -> Answer:
    """The hello a DEALER receives: its ROUTER's answer to its offer."""
    info = _map(_json(body, "shared-memory answer"), "shared-memory answer")
    arena = info.get("arena")
    return Answer(_bool(info, "attached", "answer"),
                  None if arena is None else parse_arena(arena))


def parse_refs(head: bytes, frames: int) -> Refs:
    """A by-reference descriptor for a message of `frames` body frames."""
    info = _map(_json(head, "shared-memory descriptor"), "shared-memory descriptor")
    seq = _int(info, "seq", 0, MAX_SEQ, "descriptor")
    refs = info.get("refs")
    if not isinstance(refs, list) or not 0 < len(refs) <= frames:
        raise ShmFrameError(f"descriptor field 'refs' must list 1 to {frames} frames")
    out = []
    for ref in refs:
        if (not isinstance(ref, list) or len(ref) != 3
                or not all(type(v) is int for v in ref)):
            raise ShmFrameError(f"descriptor entry {_show(ref)} is not [index, offset, length]")
        i, off, n = ref
        if not (0 <= i < frames and HEADER_BYTES <= off <= MAX_ARENA_BYTES
                and 0 <= n <= MAX_ARENA_BYTES):
            raise ShmFrameError(f"descriptor entry {ref} out of range (index < {frames}, "
                                f"offset >= {HEADER_BYTES})")
        out.append((i, off, n))
    return Refs(seq, tuple(out))
