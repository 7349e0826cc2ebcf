"""Task: one job type's definition (queue, type, payload type, codec, enqueue defaults), shared
by the code that enqueues it and the handler that runs it."""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from .._model import validate as v
from .._model.errors import SeppError, ValidationError
from .._model.settlement import OnInvalid, check_on_invalid, describe
from .._model.types import EnqueueAck, EnqueueRequest, Payload, TraceContext
from .codecs import PayloadCodec, codec_for, type_name

if TYPE_CHECKING:
    from .._client.client import Client
    from .._client.sync import SyncClient

T = TypeVar("T")


class Task(Generic[T]):
    """A job type whose payloads are `payload_type` objects:
    `send_welcome = sepp.Task("emails", "send_welcome", Welcome, max_attempts=3)`.

    Producers call `await send_welcome.enqueue(client, Welcome(...))`, or from blocking code
    `send_welcome.enqueue(sync_client, Welcome(...))` with a `sepp.SyncClient` (`request(...)`
    builds the EnqueueRequest, for `enqueue_batch` or any client's `enqueue`); workers
    register `@router.task(send_welcome)` on
    `async def handle(job: Welcome, ctx: sepp.JobContext)`. Payloads go through `codec`
    (default: pydantic's for a pydantic model, msgspec's for a msgspec Struct, else
    `sepp.JsonCodec`). `priority`, `max_attempts` and `custom` are the defaults of every enqueue;
    per-call values override them. A payload that does not decode is dead-lettered at once
    (`on_invalid="dead_letter"`) or nacked for a retry after the handler's backoff (`"retry"`).
    """

    __slots__ = (
        "_codec",
        "custom",
        "job_type",
        "max_attempts",
        "on_invalid",
        "payload_type",
        "priority",
        "queue",
    )

    def __init__(
        self,
        queue: str,
        job_type: str,
        payload_type: type[T],
        *,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
        codec: PayloadCodec | None = None,
        on_invalid: OnInvalid = "dead_letter",
    ) -> None:
        # One check of every default, by the request a plain enqueue would build.
        EnqueueRequest(
            queue, job_type, priority=priority, max_attempts=max_attempts, custom=custom or {}
        )
        if codec is not None and not isinstance(codec, PayloadCodec):
            raise ValidationError("codec", "must have encode(value) and decode(payload, into)")
        self.queue = queue
        self.job_type = job_type
        self.payload_type = payload_type
        self.priority = priority
        self.max_attempts = max_attempts
        self.custom: Mapping[str, v.CustomValue] = dict(custom or {})
        self.on_invalid = check_on_invalid(on_invalid)
        self._codec = codec if codec is not None else codec_for(payload_type)

    @property
    def codec(self) -> PayloadCodec:
        """The codec that encodes and decodes this task's payloads."""
        return self._codec

    def encode(self, payload: T) -> Payload:
        """`payload` as the `Payload` this task sends; ValidationError (field "payload") if it
        is not a `payload_type` object or the codec cannot encode it."""
        if not _is_instance(payload, self.payload_type):
            raise ValidationError(
                "payload",
                f"task {self.job_type!r} takes {type_name(self.payload_type)} payloads,"
                f" got {type(payload).__qualname__}",
            )
        try:
            return self._codec.encode(payload)
        except SeppError:
            raise
        except Exception as exc:  # a codec's own error (pydantic's, msgspec's, a custom one)
            raise ValidationError(
                "payload",
                f"{self._codec!r} cannot encode this {type_name(self.payload_type)}:"
                f" {describe(exc)}",
            ) from exc

    def decode(self, payload: Payload | None) -> T:
        """A job's payload as a `payload_type` object; raises PayloadDecodeError."""
        return self._codec.decode(payload, self.payload_type)

    def request(
        self,
        payload: T,
        *,
        queue: str | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
        scheduled_at: datetime | None = None,
        trace_context: TraceContext | None = None,
    ) -> EnqueueRequest:
        """An EnqueueRequest for this task (for `enqueue_batch`, `enqueue_atomic`); given
        values override the task's defaults."""
        return self.encoded_request(
            self.encode(payload),
            queue=queue,
            idempotency_key=idempotency_key,
            priority=priority,
            max_attempts=max_attempts,
            custom=custom,
            scheduled_at=scheduled_at,
            trace_context=trace_context,
        )

    def encoded_request(
        self,
        payload: Payload,
        *,
        queue: str | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
        scheduled_at: datetime | None = None,
        trace_context: TraceContext | None = None,
    ) -> EnqueueRequest:
        """`request` for a payload already encoded (by `encode`, or a tool that checked it)."""
        return EnqueueRequest(
            queue if queue is not None else self.queue,
            self.job_type,
            payload=payload,
            idempotency_key=idempotency_key,
            priority=priority if priority is not None else self.priority,
            max_attempts=max_attempts if max_attempts is not None else self.max_attempts,
            custom=custom if custom is not None else self.custom,
            scheduled_at=scheduled_at,
            trace_context=trace_context,
        )

    @overload
    def enqueue(
        self,
        client: SyncClient,
        payload: T,
        *,
        queue: str | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
        scheduled_at: datetime | None = None,
        trace_context: TraceContext | None = None,
        timeout: float | timedelta | None = None,
    ) -> EnqueueAck: ...

    @overload
    def enqueue(
        self,
        client: Client,
        payload: T,
        *,
        queue: str | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
        scheduled_at: datetime | None = None,
        trace_context: TraceContext | None = None,
        timeout: float | timedelta | None = None,
    ) -> Coroutine[Any, Any, EnqueueAck]: ...

    def enqueue(
        self,
        client: Client | SyncClient,
        payload: T,
        *,
        queue: str | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
        scheduled_at: datetime | None = None,
        trace_context: TraceContext | None = None,
        timeout: float | timedelta | None = None,
    ) -> EnqueueAck | Coroutine[Any, Any, EnqueueAck]:
        """Enqueue one job of this task through `client`: with a `sepp.Client` await the
        result; a `sepp.SyncClient` blocks and returns the `EnqueueAck`. Raises
        JobRejectedError if the server rejects it; a payload that does not encode raises
        ValidationError before anything is sent, as any other client raises TypeError."""
        from .._client.client import Client

        blocking = not isinstance(client, Client)
        if blocking:
            from .._client.sync import SyncClient

            if not isinstance(client, SyncClient):
                raise TypeError(
                    f"Task.enqueue(client, payload) takes a sepp.Client (await the result) or a"
                    f" sepp.SyncClient, not a {type(client).__qualname__}; with another client,"
                    f" call its enqueue(task.request(payload)) ({self!r})"
                )
        request = self.request(
            payload,
            queue=queue,
            idempotency_key=idempotency_key,
            priority=priority,
            max_attempts=max_attempts,
            custom=custom,
            scheduled_at=scheduled_at,
            trace_context=trace_context,
        )
        # Not a coroutine of our own for the blocking client: its call runs now, and an
        # un-awaited result cannot silently drop the job.
        return client.enqueue(request, timeout=timeout)

    def __repr__(self) -> str:
        name = getattr(self.payload_type, "__qualname__", repr(self.payload_type))
        return f"<sepp.Task {self.job_type!r} on {self.queue!r}: {name}>"


def _is_instance(value: object, payload_type: object) -> bool:
    """Whether `value` can be a `payload_type` (True where isinstance cannot tell: a
    TypedDict, a generic alias, a union, Any). An int is a float, as for type checkers."""
    if payload_type is float and isinstance(value, int):
        return True
    try:
        return isinstance(value, payload_type)  # type: ignore[arg-type]
    except TypeError:
        return True
