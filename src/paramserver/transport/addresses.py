"""Connectable addresses: what a process bound to a wildcard (0.0.0.0) tells peers to dial."""

from __future__ import annotations

import socket

WILDCARDS = ("0.0.0.0", "*", "")
_SOME_REMOTE = ("192.0.2.1", 9)  # TEST-NET-1: never contacted, only routed to


class AddressError(ValueError):
    """No address for peers to dial could be worked out: the user must give one."""


class PortInUse(AddressError):
    """A fixed port another process holds."""

    def __init__(self, host: str, port: int):
        super().__init__(f"port {port} on {host} is in use: give another --port (0: a free "
                         f"one)")
        self.host, self.port = host, port


def port_taken(host: str, port: int) -> bool:
    """Whether another process holds TCP `port` on `host` now (a command checks a fixed port
    before it starts anything, so the refusal comes first)."""
    import socket
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def is_wildcard(host: str) -> bool:
    return host in WILDCARDS


def route_source(host: str, port: int = 9) -> str:
    """The local IPv4 address this host sends from to reach `host`: a UDP socket "connected"
    there sends nothing, but the kernel picks the route and so the source address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def advertised_host(bind_host: str, toward: str | None = None,
                    advertise: str | None = None) -> str:
    """The host part of the address peers should dial for a socket bound to `bind_host`.

    `advertise` wins; a specific `bind_host` is itself; a wildcard becomes the address that
    routes to `toward` (the coordinator's tcp://host:port, for a server), else to the default
    route. Raises AddressError when no such address can be found."""
    if advertise:
        return advertise
    if not is_wildcard(bind_host):
        return bind_host
    try:
        if toward:
            host, port = toward.split("://", 1)[-1].rsplit(":", 1)
            return route_source(host.strip("[]"), int(port))
        return route_source(*_SOME_REMOTE)
    except (OSError, ValueError) as exc:
        raise AddressError(f"bound to {bind_host or '*'}, but no address for peers to reach this "
                         f"host could be found ({exc}): give one with --advertise") from None
