"""Messages over sockets: the glue between the wire format and the transport."""
