"""How a call failed below the gRPC status, and what that means for retrying it.

A misspelt kind in a set of strings would silently change retry behaviour (an ambiguous failure
retried is a duplicated job), so each kind carries its own verdicts.
"""

from __future__ import annotations

import enum


class FailureKind(enum.Enum):
    """`final`: a retry cannot change the outcome. `ambiguous`: the request may have reached
    the server and been committed, so only idempotent calls may be retried after it.
    `unprocessed`: the server provably never processed the call, so the transport sends it
    again by itself, whatever the retry policy (gRPC's transparent retry)."""

    #            label          final  ambiguous  unprocessed
    # the response exceeded the receive limit, or the request's headers the server's limit
    TOO_LARGE = ("too_large", True, False, False)
    COMPRESSED = ("compressed", True, False, False)  # a compressed message, none was accepted
    MALFORMED = ("malformed", True, False, False)  # a response we cannot read
    HTTP = ("http", False, False, False)  # a non-200 HTTP answer (a proxy's); mapped by :status
    RESET = ("reset", False, False, False)  # the server reset the stream; mapped by its code
    GOAWAY = ("goaway", False, False, True)  # above the GOAWAY's last stream id
    REFUSED = ("refused", False, False, True)  # REFUSED_STREAM before any response headers
    UNSENT = ("unsent", False, False, True)  # the connection died before the request left
    CONNECTION = ("connection", False, True, False)  # the connection died with the call sent
    PROTOCOL = ("protocol", False, True, False)  # the peer broke HTTP/2 with the call in flight
    CONNECT = ("connect", False, False, False)  # no connection could be made: nothing was sent
    CLOSED = ("closed", True, False, False)  # the client was closed
    DEADLINE = ("deadline", False, True, False)  # the call's own deadline passed

    def __init__(self, label: str, final: bool, ambiguous: bool, unprocessed: bool) -> None:
        self.label = label
        self.final = final
        self.ambiguous = ambiguous
        self.unprocessed = unprocessed

    def __str__(self) -> str:
        return self.label
