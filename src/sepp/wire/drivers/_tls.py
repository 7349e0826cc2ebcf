"""TLS over memory buffers (`ssl.SSLObject`), for both drivers: the socket carries what
`encrypt` returns and feeds `decrypt`, so TLS never owns the socket. A failed write thus leaves
the read side alone (what the server sent before resetting the connection can still be read
and decrypted), and plain and TLS connections share one I/O path."""

from __future__ import annotations

import ssl

from ._base import Endpoint

_READ_BYTES = 256 * 1024
HANDSHAKE_EOF = "the server closed the connection in the TLS handshake"


class Tls:
    """One connection's TLS state. Not thread-safe: the driver serialises its calls."""

    def __init__(self, ep: Endpoint) -> None:
        assert ep.ssl_context is not None
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ep.ssl_context.wrap_bio(
            self._incoming,
            self._outgoing,
            server_side=False,
            server_hostname=ep.server_hostname or ep.host,
        )

    def handshake_step(self, received: bytes | None = None) -> tuple[bool, bytes]:
        """Feed what the server sent (None at the start); returns whether the handshake is
        done and the bytes to send now. Raises ssl.SSLError (a bad certificate, say)."""
        if received is not None:
            self._incoming.write(received)
        try:
            self.obj.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        return done, self._outgoing.read()

    @property
    def alpn_h2(self) -> bool:
        return self.obj.selected_alpn_protocol() == "h2"

    def encrypt(self, data: bytes) -> bytes:
        if data:
            self.obj.write(data)
        return self._outgoing.read()

    def decrypt(self, data: bytes | bytearray) -> bytes:
        """The plaintext of the whole records in what has arrived (ssl.SSLError for a broken
        record: the connection is unusable)."""
        self._incoming.write(data)
        chunks = []
        while True:
            try:
                chunk = self.obj.read(_READ_BYTES)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            if not chunk:  # close_notify
                break
            chunks.append(chunk)
        return b"".join(chunks)
