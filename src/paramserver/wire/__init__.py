"""Wire format: messages <-> frames, no sockets."""

from paramserver.wire.codec import Message, WireError, decode, encode, reply_error
from paramserver.wire.protocol import PROTOCOL_VERSION

__all__ = ["Message", "PROTOCOL_VERSION", "WireError", "decode", "encode", "reply_error"]
