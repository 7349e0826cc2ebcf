"""How a call failed below the gRPC status, and what that means for retrying it.

A misspelt kind in a set of strings would silently change retry behaviour (an ambiguous failure
retried is a duplicated job), so each kind carries its own verdicts.
"""

from __future__ import annotations

import enum


class FailureKind(enum.Enum):
    """`final`: a retry cannot change the outcome. `ambiguous`: the request may have reached
    the server and been committed, so only idempotent calls may be retried after it."""

    #            label          final  ambiguous
    TOO_LARGE = ("too_large", True, False)  # the response exceeded the receive limit
    COMPRESSED = ("compressed", True, False)  # a compressed message, none was accepted
    MALFORMED = ("malformed", True, False)  # a response we cannot read
    HTTP = ("http", False, False)  # a non-200 HTTP answer (a proxy's); mapped by :status
    RESET = ("reset", False, False)  # the server reset the stream; mapped by its error code
    GOAWAY = ("goaway", False, False)  # above the GOAWAY's last stream id: never processed
    CONNECTION = ("connection", False, True)  # the connection died with the call in flight
    PROTOCOL = ("protocol", False, True)  # the peer broke HTTP/2 with the call in flight
    CONNECT = ("connect", False, False)  # no connection could be made: nothing was sent
    CLOSED = ("closed", True, False)  # the client was closed
    DEADLINE = ("deadline", False, True)  # the call's own deadline passed

    def __init__(self, label: str, final: bool, ambiguous: bool) -> None:
        self.label = label
        self.final = final
        self.ambiguous = ambiguous

    def __str__(self) -> str:
        return self.label
