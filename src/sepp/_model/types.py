"""The values users handle: payloads, requests, jobs, leases, server info and dead letters."""

from __future__ import annotations

import builtins
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, overload

from . import validate as v
from .deferred import spent_attempts
from .errors import ValidationError
from .rejections import BatchRejection as BatchRejection

if TYPE_CHECKING:
    from .limit_stats import LimitStats

CustomValue = v.CustomValue
JSON_ENCODING = "application/json"
TEXT_ENCODING = "text/plain; charset=utf-8"
BYTES_ENCODING = "application/octet-stream"


class _JsonAccess:
    """`Payload.json(value)` builds a payload; `payload.json()` reads one."""

    @overload
    def __get__(self, obj: None, owner: type[Payload]) -> Callable[[object], Payload]: ...
    @overload
    def __get__(self, obj: Payload, owner: type[Payload]) -> Callable[[], Any]: ...
    def __get__(
        self, obj: Payload | None, owner: type[Payload]
    ) -> Callable[[object], Payload] | Callable[[], Any]:
        if obj is None:
            return owner._from_json
        return obj._read_json


class _TextAccess:
    """`Payload.text(str)` builds a payload; `payload.text()` reads one."""

    @overload
    def __get__(self, obj: None, owner: type[Payload]) -> Callable[[str], Payload]: ...
    @overload
    def __get__(self, obj: Payload, owner: type[Payload]) -> Callable[[], str]: ...
    def __get__(
        self, obj: Payload | None, owner: type[Payload]
    ) -> Callable[[str], Payload] | Callable[[], str]:
        if obj is None:
            return owner._from_text
        return obj._read_text


@dataclass(frozen=True, slots=True)
class Payload:
    """A job body: opaque bytes plus an encoding label. `data` must not be empty (omit the
    payload instead)."""

    data: builtins.bytes
    encoding: str

    json: ClassVar[_JsonAccess] = _JsonAccess()
    text: ClassVar[_TextAccess] = _TextAccess()

    def __post_init__(self) -> None:
        raw: object = self.data
        if isinstance(raw, (bytearray, memoryview)):
            object.__setattr__(self, "data", builtins.bytes(raw))
        elif not isinstance(raw, builtins.bytes):
            raise ValidationError("payload.data", f"must be bytes, got {type(self.data).__name__}")
        if not self.data:
            raise ValidationError("payload.data", "must not be empty (omit the payload instead)")
        v.utf8_text("payload.encoding", self.encoding)

    @classmethod
    def bytes(
        cls, data: builtins.bytes | bytearray | memoryview, encoding: str = BYTES_ENCODING
    ) -> Payload:
        """Raw bytes labelled `encoding` (default `application/octet-stream`)."""
        return cls(builtins.bytes(data), encoding)

    @classmethod
    def _from_json(cls, value: object) -> Payload:
        import json  # here, not at the top: it is 10 % of `import sepp`

        try:
            # NaN and Infinity are not JSON: other clients' parsers refuse them.
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValidationError("payload", f"not JSON-serialisable: {exc}") from None
        return cls(text.encode("utf-8"), JSON_ENCODING)

    @classmethod
    def _from_text(cls, value: str) -> Payload:
        return cls(v.utf8_text("payload", value).encode("utf-8"), TEXT_ENCODING)

    def _read_json(self) -> Any:
        import json

        return json.loads(self.data)

    def _read_text(self) -> str:
        return self.data.decode("utf-8")

    def __repr__(self) -> str:
        shown = self.data[:32]
        more = "…" if len(self.data) > 32 else ""
        return f"Payload({shown!r}{more}, encoding={self.encoding!r}, {len(self.data)} bytes)"


@dataclass(frozen=True, slots=True)
class TraceContext:
    """W3C trace context carried with a job."""

    traceparent: str
    tracestate: str | None = None

    def __post_init__(self) -> None:
        v.utf8_text("trace_context.traceparent", self.traceparent)
        if self.tracestate is not None:
            v.utf8_text("trace_context.tracestate", self.tracestate, allow_empty=True)


# (queue, job_type) pairs that passed EnqueueRequest's checks (exact str only), bounded.
_CHECKED: set[tuple[str, str]] = set()
# EnqueueRequest's default custom map: replaced by a fresh dict in each request.
_NO_CUSTOM: Mapping[str, CustomValue] = MappingProxyType({})


@dataclass(frozen=True, slots=True, init=False)
class EnqueueRequest:
    """One job to enqueue. Checked on construction: bad values raise ValidationError."""

    queue: str
    job_type: str
    payload: Payload | None = None
    idempotency_key: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    custom: Mapping[str, CustomValue] = field(default_factory=dict)
    scheduled_at: datetime | None = None
    trace_context: TraceContext | None = None

    # Written out rather than generated: batches build requests by the hundred, and the
    # generated __init__ of a frozen dataclass sets each field with object.__setattr__ (a
    # lookup of the name per field) before __post_init__ reads them all back; this one checks
    # the arguments, then stores them through the slots' own setters (_SLOT_SETTERS).
    def __init__(
        self,
        queue: str,
        job_type: str,
        payload: Payload | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, CustomValue] = _NO_CUSTOM,
        scheduled_at: datetime | None = None,
        trace_context: TraceContext | None = None,
    ) -> None:
        # A (queue, job_type) pair checked before is one set lookup.
        names = (queue, job_type)
        if type(queue) is not str or type(job_type) is not str or names not in _CHECKED:
            v.queue_name("queue", queue)
            v.utf8_text("job_type", job_type)
            if len(_CHECKED) >= 256:
                _CHECKED.clear()
            _CHECKED.add(names)
        if payload is not None and not isinstance(payload, Payload):
            raise ValidationError(
                "payload", f"must be a sepp.Payload, got {type(payload).__name__}"
            )
        if idempotency_key is not None:
            v.utf8_text("idempotency_key", idempotency_key)
        if priority is not None:
            v.whole_number("priority", priority, low=0, high=9)
        if max_attempts is not None:
            v.whole_number("max_attempts", max_attempts, low=1, high=v.UINT32_MAX)
        # Copied either way: the caller's dict may change after the check.
        if custom is _NO_CUSTOM or (type(custom) is dict and not custom):
            custom = {}
        else:
            custom = v.custom_map("custom", custom)
        if scheduled_at is not None:
            scheduled_at = v.aware_datetime("scheduled_at", scheduled_at)
        if trace_context is not None and not isinstance(trace_context, TraceContext):
            raise ValidationError("trace_context", "must be a sepp.TraceContext")
        (
            set_queue,
            set_job_type,
            set_payload,
            set_idempotency_key,
            set_priority,
            set_max_attempts,
            set_custom,
            set_scheduled_at,
            set_trace_context,
        ) = _SLOT_SETTERS
        set_queue(self, queue)
        set_job_type(self, job_type)
        set_payload(self, payload)
        set_idempotency_key(self, idempotency_key)
        set_priority(self, priority)
        set_max_attempts(self, max_attempts)
        set_custom(self, custom)
        set_scheduled_at(self, scheduled_at)
        set_trace_context(self, trace_context)


_SLOT_SETTERS = tuple(vars(EnqueueRequest)[f.name].__set__ for f in fields(EnqueueRequest))


@dataclass(frozen=True, slots=True)
class EnqueueAck:
    """The server accepted a job. `deduplicated` means an earlier job with the same
    idempotency key exists, and `job_id` is that job's."""

    job_id: str
    deduplicated: bool = False


class _Lease:
    """The part of a JobContext that is not the job's own: the expiry an extend was granted
    (the one thing that changes), and the client and worker state a handler is given.
    `limits`, set only for a job of a handler with a `sepp.Limit` (unset otherwise: nothing
    to pay for), says how its limits stand."""

    __slots__ = ("client", "expires_at", "follow_ups", "limits", "state", "worker_id")

    limits: Callable[[], tuple[LimitStats, ...]]

    def __init__(
        self, expires_at: datetime, worker_id: str | None, client: object, state: object
    ) -> None:
        self.expires_at = expires_at
        self.worker_id = worker_id
        self.client = client
        self.state = state
        # What the handler asked to enqueue when it succeeds (`JobContext.then`); None: nothing.
        self.follow_ups: list[EnqueueRequest] | None = None


@dataclass(frozen=True, slots=True, eq=False)
class JobContext:
    """Everything about a reserved job but its payload, plus its lease.

    Every field is fixed except the lease expiry, which `Client.extend` moves: the handler,
    the worker's lease keeper and your code share one context, so all of them see it. Build
    one for a handler's unit test with `sepp.testing.job_context()`.
    """

    id: str
    queue: str
    job_type: str
    attempt: int
    max_attempts: int
    priority: int
    custom: Mapping[str, CustomValue]
    enqueued_at: datetime
    scheduled_at: datetime | None
    trace_context: TraceContext | None
    _lease: _Lease = field(repr=False)

    @property
    def lease_expires_at(self) -> datetime:
        """When the lease runs out, as last granted by reserve or extend."""
        return self._lease.expires_at

    @property
    def worker_id(self) -> str | None:
        """The worker id the job was reserved with (sent back on ack/nack/extend)."""
        return self._lease.worker_id

    @property
    def client(self) -> Any:  # a sepp.Client: typed Any, as _types cannot import _client
        """The `sepp.Client` that reserved the job (the Worker's, in a handler): enqueue
        follow-up jobs with it. RuntimeError if there is none (a context from
        `sepp.testing.job_context()` without `client=`)."""
        client = self._lease.client
        if client is None:
            raise RuntimeError(
                "this JobContext has no client; in a test, pass client= to"
                " sepp.testing.job_context()"
            )
        return client

    @property
    def state(self) -> Any:
        """What the Worker's lifespan yielded (None without one, and from a raw reserve)."""
        return self._lease.state

    @property
    def is_final_attempt(self) -> bool:
        """Whether this is the last attempt: a nack now sends the job to the dead letters.
        Exact across a `sepp.Limit`'s deferrals too: a deferred copy is allowed just the
        attempts its job had left."""
        return self.attempt >= self.max_attempts

    def then(self, *jobs: EnqueueRequest | Enqueueable) -> None:
        """Enqueue `jobs` once this job's handler has succeeded, before the job is acked:
        `sepp.EnqueueRequest`s, `task.job(payload)`s, a `sepp.chain(...)` (its first step) or
        a `sepp.group(...)` (every member). The Worker sends them all in one atomic enqueue,
        each under an idempotency key made from this job's id and the follow-up's place
        (a request's own key is kept), so a redelivery of this job (its ack was lost, its
        worker killed) does not enqueue them twice within the server's dedup window. A handler
        that fails (or is cancelled) enqueues none. Checked now: TypeError for anything else.
        """
        requests = _follow_up_requests(jobs)
        lease = self._lease
        if lease.follow_ups is None:
            lease.follow_ups = requests
        else:
            lease.follow_ups.extend(requests)

    @property
    def logical_attempt(self) -> int:
        """The job's attempt counted across the copies a `sepp.Limit` made when it deferred
        the job (waiting for a limit never costs an attempt): `attempt` for a job never
        deferred. `attempt` itself is this delivery's, which ack, nack and extend send."""
        return spent_attempts(self.custom) + self.attempt

    @property
    def logical_max_attempts(self) -> int:
        """`max_attempts` counted across a deferred job's copies, as `logical_attempt` is."""
        return spent_attempts(self.custom) + self.max_attempts

    @property
    def limits(self) -> tuple[LimitStats, ...]:
        """How the `sepp.Limit`s this job's handler was admitted through stand now in this
        Worker process, for this job's key: one `sepp.LimitStats` each (how many run, how
        many wait), outermost first. `()` for a handler without limits."""
        view: Callable[[], tuple[LimitStats, ...]] | None = getattr(self._lease, "limits", None)
        return () if view is None else view()

    def __str__(self) -> str:
        return f"{self.job_type}[{self.id}] on {self.queue} ({self.attempt}/{self.max_attempts})"


class Enqueueable(Protocol):
    """A job (or jobs) to enqueue, not yet sent: a `sepp.TaskJob`, a `sepp.Chain` (its first
    step) or a `sepp.Group` (every member); `JobContext.then` takes them, as it takes
    EnqueueRequests."""

    def _enqueue_requests(self) -> list[EnqueueRequest]:
        """The requests to send, checked and in order (a chain's first step carries its
        chain's entries, made anew at each call)."""
        ...


def _follow_up_requests(jobs: tuple[object, ...]) -> list[EnqueueRequest]:
    requests: list[EnqueueRequest] = []
    for job in jobs:
        if isinstance(job, EnqueueRequest):
            requests.append(job)
            continue
        make = getattr(job, "_enqueue_requests", None)
        if make is None:
            raise TypeError(
                "ctx.then() takes sepp.EnqueueRequest, sepp.TaskJob (task.job(payload)),"
                f" sepp.Chain or sepp.Group objects, not {type(job).__name__}"
            )
        requests.extend(make())
    return requests


def follow_ups(ctx: JobContext) -> list[EnqueueRequest]:
    """What the handler of `ctx` asked to enqueue with `ctx.then`, in order."""
    return list(ctx._lease.follow_ups or ())


_new = object.__new__
_set_payload_data, _set_payload_encoding = (vars(Payload)[n].__set__ for n in ("data", "encoding"))


def reserved_job(
    data: builtins.bytes | None,
    encoding: str,
    id: str,
    queue: str,
    job_type: str,
    attempt: int,
    max_attempts: int,
    priority: int,
    custom: Mapping[str, CustomValue],
    enqueued_at: datetime,
    scheduled_at: datetime | None,
    trace_context: TraceContext | None,
    lease_expires_at: datetime,
    worker_id: str | None,
    client: object,
    state: object = None,
) -> Job:
    """A job a reserve returned (or a test's, `sepp.testing.job_context`), its fields read and
    checked by the caller: its Payload (none for empty `data`) without the checks a caller's
    Payload gets (the reader decoded valid UTF-8; a missing encoding is the default's), its
    context leased until `lease_expires_at`. Positional in the readers: a drain builds one a
    job, and keyword arguments cost more."""
    payload: Payload | None = None
    if data:
        payload = _new(Payload)
        _set_payload_data(payload, data if type(data) is builtins.bytes else builtins.bytes(data))
        _set_payload_encoding(payload, encoding or BYTES_ENCODING)
    ctx = JobContext(
        id,
        queue,
        job_type,
        attempt,
        max_attempts,
        priority,
        custom,
        enqueued_at,
        scheduled_at,
        trace_context,
        _Lease(lease_expires_at, worker_id, client, state),
    )
    return Job(payload, ctx)


def set_handler_context(ctx: JobContext, client: object, state: object) -> None:
    """Give a handler's context the worker's client and lifespan state."""
    lease = ctx._lease
    lease.client = client
    lease.state = state


def record_lease_expiry(ctx: JobContext, expires_at: datetime) -> None:
    """Record the expiry an extend was granted: the one change a JobContext sees."""
    ctx._lease.expires_at = expires_at


@dataclass(frozen=True, slots=True)
class Job:
    """A reserved job: its payload and its context."""

    payload: Payload | None
    ctx: JobContext

    @property
    def id(self) -> str:
        """The job's id (`ctx.id`)."""
        return self.ctx.id


@dataclass(frozen=True, slots=True)
class Retry:
    """What a nack asks for: `Retry.DEFAULT` (the queue's policy), `Retry.after(delay)`,
    or `Retry.DEAD_LETTER`."""

    kind: Literal["default", "delay", "dead_letter"]
    delay: timedelta | None = None

    DEFAULT: ClassVar[Retry]
    DEAD_LETTER: ClassVar[Retry]

    @classmethod
    def after(cls, delay: float | timedelta) -> Retry:
        """Retry once `delay` (seconds or timedelta, ≥ 0) has passed."""
        seconds = v.seconds("delay", delay, allow_zero=True)
        return cls("delay", timedelta(seconds=seconds))


Retry.DEFAULT = Retry("default")
Retry.DEAD_LETTER = Retry("dead_letter")


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """The server's version and its global limits (per-queue overrides are not advertised)."""

    server_version: str
    supported_protocol_versions: tuple[str, ...]
    server_time: datetime
    restricts_encodings: bool
    allowed_encodings: tuple[str, ...]
    max_payload_bytes: int
    max_custom_entries: int
    max_custom_total_bytes: int
    max_custom_key_bytes: int
    max_queue_name_bytes: int
    max_job_type_bytes: int
    max_idempotency_key_bytes: int
    max_schedule_horizon: timedelta
    max_enqueue_batch: int
    max_reserve_batch: int
    max_reserve_queues: int
    max_wait_timeout: timedelta
    max_lease_duration: timedelta
    strict_queues: bool
    dead_letter_retention_enabled: bool


class DeadLetterCause(enum.Enum):
    """Why a job was dead-lettered: its attempts ran out, a handler rejected it (a nack with
    `Retry.DEAD_LETTER`), its lease expired on the final attempt, or an administrator moved it.
    UNSPECIFIED is a value this client does not know."""

    UNSPECIFIED = 0
    ATTEMPTS_EXHAUSTED = 1
    REJECTED = 2
    LEASE_EXPIRED = 3
    ADMIN = 4


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """A dead-lettered job, removed from the server when drained."""

    job_id: str
    queue: str
    job_type: str
    payload: Payload | None
    priority: int
    attempt: int
    max_attempts: int
    custom: Mapping[str, CustomValue]
    trace_context: TraceContext | None
    enqueued_at: datetime | None
    scheduled_at: datetime | None
    cause: DeadLetterCause
    failed_at: datetime | None
    final_attempt: int
    last_reason: str | None

    def to_enqueue_request(self, *, queue: str | None = None) -> EnqueueRequest:
        """A fresh job (new id, attempt 1) with this one's type, payload, priority, custom map
        and trace context; the schedule and idempotency key are not carried over."""
        return EnqueueRequest(
            queue=queue or self.queue,
            job_type=self.job_type,
            payload=self.payload,
            priority=self.priority if 0 <= self.priority <= 9 else None,
            max_attempts=self.max_attempts or None,
            custom=dict(self.custom),
            trace_context=self.trace_context,
        )
