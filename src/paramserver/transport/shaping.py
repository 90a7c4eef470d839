"""Emulated links in the transport: with a link installed, each message this process sends or
receives waits for its bytes in the link's token bucket (paramserver.emulation.links) and its latency.

One link per process, as one NIC per host: every socket of the process shares it, and the
heartbeat thread too (hence the lock; the sleep itself is outside it). Bytes are the logical
ones: a frame that goes through shared memory (transport.shm) is charged in full, as if it had
crossed the wire. Installed by the worker from the job's link table (by rank), or from
$PARAMSERVER_LINK (`RATE[,LATENCY]`, e.g. set by the launcher for a server) at the first
new_context().
"""

from __future__ import annotations

import os
import threading
import time

from paramserver.emulation.links import Link, LinkSpec, parse_link

ENV = "PARAMSERVER_LINK"
_LOCK = threading.Lock()
_LINK: Link | None = None
_FROM_ENV_DONE = False


def install(spec: LinkSpec | None) -> None:
    """Shape this process's traffic with `spec` from now on (None: no shaping)."""
    global _LINK
    with _LOCK:
        _LINK = None if spec is None or (spec.rate is None and not spec.latency) else Link(
            spec, time.monotonic())


def install_from_env() -> None:
    """Once per process: the link named by $PARAMSERVER_LINK, if any."""
    global _FROM_ENV_DONE
    if _FROM_ENV_DONE:
        return
    _FROM_ENV_DONE = True
    text = os.environ.get(ENV, "").strip()
    if text:
        install(parse_link(text))


def current() -> LinkSpec | None:
    link = _LINK
    return None if link is None else link.spec


def active() -> bool:
    return _LINK is not None


def _size(part) -> int:
    nbytes = getattr(part, "nbytes", None)
    return int(nbytes) if nbytes is not None else len(part)


def on_send(parts) -> None:
    """Block until the link has carried `parts` (before they go to the socket)."""
    _wait(parts, up=True)


def on_recv(parts) -> None:
    """Block until the link has delivered `parts` (after they came out of the socket)."""
    _wait(parts, up=False)


def _wait(parts, up: bool) -> None:
    link = _LINK
    if link is None:
        return
    nbytes = sum(_size(p) for p in parts)
    with _LOCK:
        now = time.monotonic()
        delay = link.send_delay(nbytes, now) if up else link.recv_delay(nbytes, now)
    if delay > 0:
        time.sleep(delay)
