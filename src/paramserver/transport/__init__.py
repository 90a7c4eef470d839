"""Transport: frames <-> sockets; opaque bytes, no knowledge of the protocol."""

from paramserver.transport.addresses import advertised_host
from paramserver.transport.zmq_sockets import (
    DEFAULT_HWM, bind_router, connect_dealer, keep_freed_memory, new_context, recv_all,
    recv_frames, recv_message, send_frames, terminate,
)

__all__ = ["DEFAULT_HWM", "advertised_host", "bind_router", "connect_dealer", "keep_freed_memory",
           "new_context", "recv_all", "recv_frames", "recv_message", "send_frames", "terminate"]
