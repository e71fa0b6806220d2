"""The server name a TLS client asks for: the ``server_name`` extension of its first ClientHello.

A tunnel the allowlist proxy opened to an allowed host could carry a TLS session for another
name served from the same front end (domain fronting); the proxy reads the name the client
says first and holds it to the same list (:mod:`.egress`). Only the first record is read, and
only as far as that extension (RFC 8446, sections 4.1.2 and 4.2; RFC 6066, section 3).
"""

from __future__ import annotations

#: A TLS record's most plaintext (2^14) and its header.
MAX_RECORD = 16384
HEADER = 5
_HANDSHAKE, _CLIENT_HELLO, _SERVER_NAME, _HOST_NAME = 0x16, 0x01, 0x0000, 0x00


class NotAHello(ValueError):
    """A TLS handshake record that is no ClientHello this reader can take apart (the message says where)."""


def is_handshake(first: bytes) -> bool:
    """Whether a stream that starts with ``first`` (at least one byte) is a TLS handshake."""
    return first[:1] == bytes([_HANDSHAKE])


def record_length(header: bytes) -> int:
    """The payload length a TLS record ``header`` announces (refused above :data:`MAX_RECORD`)."""
    if len(header) < HEADER:
        raise NotAHello("the stream ended inside a record header")
    length = int.from_bytes(header[3:5], "big")
    if length > MAX_RECORD:
        raise NotAHello(f"a record of {length} bytes")
    return length


def server_name(payload: bytes) -> str | None:
    """The host name in a ClientHello record's ``payload``, lower-cased; None when it names none."""
    cursor = _Cursor(payload)
    if cursor.integer(1) != _CLIENT_HELLO:
        raise NotAHello("the first handshake message is not a ClientHello")
    hello = _Cursor(cursor.take(cursor.integer(3)))  # a hello split over records is not read
    hello.take(2 + 32)  # legacy_version, random
    hello.take(hello.integer(1))  # legacy_session_id
    hello.take(hello.integer(2))  # cipher_suites
    hello.take(hello.integer(1))  # legacy_compression_methods
    if hello.done():
        return None  # no extensions at all
    extensions = _Cursor(hello.take(hello.integer(2)))
    while not extensions.done():
        kind, body = extensions.integer(2), extensions.take(extensions.integer(2))
        if kind != _SERVER_NAME:
            continue
        names = _Cursor(body)
        names = _Cursor(names.take(names.integer(2)))
        while not names.done():
            name_type, name = names.integer(1), names.take(names.integer(2))
            if name_type == _HOST_NAME:
                try:
                    return name.decode("ascii").lower().rstrip(".")
                except UnicodeDecodeError:
                    raise NotAHello("a server name that is not ASCII") from None
        return None
    return None


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise NotAHello(f"{count} bytes announced at offset {self.at}, {len(self.data) - self.at} there")
        self.at += count
        return self.data[self.at - count : self.at]

    def integer(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def done(self) -> bool:
        return self.at >= len(self.data)
