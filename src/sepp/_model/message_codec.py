"""Which message codec encodes requests and decodes responses: our own (`wire_requests`,
`wire_responses`: pure Python, straight between bytes and our types), or the generated protobuf
classes (`protobuf_codec`), the reference. Both are modules with the functions of `Requests` and
`Responses`; the client reads `REQUESTS` and `RESPONSES` at each call.

The default, "auto", is the faster of the two per message: ours everywhere, but where protobuf
runs on upb (C), upb parses the responses that carry jobs (Reserve, DrainDeadLetters) faster than
our reader does (a Worker's drain: ~8 % less client CPU), so those go through protobuf. Requests
are ours everywhere: an EnqueueBatch of plain jobs costs our encoder about a quarter of what
building and serializing upb's message does (docs/performance.md, "The batch path").
SEPP_MESSAGE_CODEC=sepp or =protobuf picks one codec for everything.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol, cast

from . import wire_requests, wire_responses

if TYPE_CHECKING:
    from .rejections import JobRejection
    from .types import (
        DeadLetterRecord,
        EnqueueAck,
        EnqueueRequest,
        Job,
        Retry,
        ServerInfo,
        TraceContext,
    )

ENV = "SEPP_MESSAGE_CODEC"
NAMES = ("sepp", "protobuf")  # the codecs; the tests run suites over each
DEFAULT = "auto"


class Requests(Protocol):
    def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest], trace: TraceContext | None = None
    ) -> bytes | tuple[bytes, ...]: ...
    def reserve(
        self,
        queues: Sequence[str],
        wait_s: float,
        lease_s: float,
        worker_id: str | None,
        max_jobs: int | None,
    ) -> bytes: ...
    def ack(self, job_id: str, attempt: int, worker_id: str | None) -> bytes: ...
    def nack(
        self, job_id: str, attempt: int, reason: str | None, retry: Retry, worker_id: str | None
    ) -> bytes: ...
    def extend(self, job_id: str, attempt: int, lease_s: float, worker_id: str | None) -> bytes: ...
    def drain_dead_letters(self, queue: str | None, max: int) -> bytes: ...


class Responses(Protocol):
    """Readers raise wire_format.DecodeError for bytes that do not parse, convert.Malformed
    for a message that cannot become our type."""

    def batch_results(self, body: bytes, expected: int) -> list[EnqueueAck | JobRejection]: ...
    def single_result(self, body: bytes) -> EnqueueAck | JobRejection: ...
    def atomic_acks(self, body: bytes, expected: int) -> list[EnqueueAck]: ...
    def reserved_jobs(self, body: bytes) -> Sequence[Any]: ...
    def job(self, fields: Any, worker_id: str | None, client: object = None) -> Job: ...
    def ack_response(self, body: bytes) -> None: ...
    def nack_dead_lettered(self, body: bytes) -> bool: ...
    def extended_until(self, body: bytes) -> datetime: ...
    def dead_letter_records(self, body: bytes) -> Sequence[Any]: ...
    def dead_letter(self, record: Any) -> DeadLetterRecord: ...
    def server_info(self, body: bytes) -> ServerInfo: ...


def requests_of(name: str) -> Requests:
    if name == "protobuf":
        from . import protobuf_codec

        return protobuf_codec
    return wire_requests


def responses_of(name: str) -> Responses:
    if name == "protobuf":
        from . import protobuf_codec

        return protobuf_codec
    return wire_responses


_PROTOBUF_IMPLEMENTATION = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"  # protobuf's own switch
_JOB_READERS = ("reserved_jobs", "job", "dead_letter_records", "dead_letter")


def upb_present() -> bool:
    """Whether protobuf would run on upb, found without importing protobuf where it would not
    (PyPy, free-threaded builds and pure-Python installs never load it under "auto")."""
    if os.environ.get(_PROTOBUF_IMPLEMENTATION, "upb") != "upb":
        return False
    try:
        if importlib.util.find_spec("google._upb._message") is None:
            return False
    except (ImportError, ValueError):
        return False
    from google.protobuf.internal import api_implementation

    return bool(api_implementation.Type() == "upb")


def fastest_responses() -> Responses:
    """Our readers, with protobuf's for the responses that carry jobs where upb parses them."""
    if not upb_present():
        return wire_responses
    from . import protobuf_codec

    names = [name for name in vars(Responses) if not name.startswith("_")]
    readers = {name: getattr(wire_responses, name) for name in names}
    readers.update({name: getattr(protobuf_codec, name) for name in _JOB_READERS})
    return cast(Responses, SimpleNamespace(**readers))


def select(name: str) -> None:
    """Use the codec `name` from the next call on (tests run suites over each)."""
    global NAME, REQUESTS, RESPONSES
    if name != DEFAULT and name not in NAMES:
        choices = ", ".join((DEFAULT, *NAMES))
        raise ValueError(f"{ENV} must be one of {choices}, got {name!r}")
    # "auto" decides at preload (finding upb imports protobuf, kept out of `import sepp`).
    NAME, REQUESTS = name, requests_of(name)
    RESPONSES = responses_of(name)


def preload() -> None:
    """Load what the codec needs before the first call (protobuf's classes take ~25 ms)."""
    global RESPONSES
    if NAME == DEFAULT and RESPONSES is wire_responses:
        RESPONSES = fastest_responses()
    if RESPONSES is not wire_responses:
        from . import protobuf_codec

        protobuf_codec.preload()


NAME: str = DEFAULT
REQUESTS: Requests = wire_requests
RESPONSES: Responses = wire_responses
select(os.environ.get(ENV) or DEFAULT)
