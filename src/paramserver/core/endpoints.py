"""A coordinator's address as every role and script dials it: tcp://HOST:PORT. Checked as text,
before any socket is made, so a malformed one is named with its fix instead of surfacing as a
socket library error. Pure."""

from __future__ import annotations


# A role joining an address where no coordinator answers says so after SAY_WAITING seconds
# (a wrong address or a job not started yet), then waits out its own timeout: the log line,
# with the address, the seconds waited and the timeout.
SAY_WAITING = 3.0
NO_ANSWER_YET = ("no answer yet from a coordinator at %s (%.0f s): is a job running there? "
                 "(paramserver serve or launch starts one); giving up after %.0f s")


class EndpointError(ValueError):
    """Not an address to join; says the form."""


def endpoint(text: str) -> str:
    """`text` as tcp://HOST:PORT (HOST:PORT is read as that); EndpointError otherwise."""
    addr = text if "://" in text else f"tcp://{text}"
    scheme, rest = addr.split("://", 1)
    host, sep, port = rest.rpartition(":")
    if scheme != "tcp" or not sep or not host or not port.isdigit() \
            or not 0 < int(port) <= 65535:
        raise EndpointError(f"{text!r} is no address to join: give tcp://HOST:PORT, e.g. "
                            f"tcp://10.0.0.1:5555 (the coordinator's, from its address file)")
    return addr
