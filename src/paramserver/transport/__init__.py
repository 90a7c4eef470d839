"""Transport: frames <-> sockets; opaque bytes, no knowledge of the protocol."""

from paramserver.transport.addresses import advertised_host
from paramserver.transport.zmq_sockets import (
    DEFAULT_HWM, PortHold, bind_router, connect_dealer, keep_freed_memory, new_context, recv_all,
    recv_frames, recv_message, return_freed_memory, send_frames, terminate,
)

__all__ = ["DEFAULT_HWM", "PortHold", "advertised_host", "bind_router", "connect_dealer",
           "keep_freed_memory", "new_context", "recv_all", "recv_frames", "recv_message",
           "return_freed_memory", "send_frames", "terminate"]
