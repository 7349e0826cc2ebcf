"""Task: one job type's definition (queue, type, payload type, codec, enqueue defaults), shared
by the code that enqueues it and the handler that runs it."""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, Unpack, overload

from .._client.client_kind import either_client
from .._model import pipelines as p
from .._model import validate as v
from .._model.errors import SeppError, ValidationError
from .._model.settlement import OnInvalid, check_on_invalid, describe
from .._model.types import EnqueueAck, EnqueueRequest, Payload, TraceContext
from .codecs import JsonCodec, PayloadCodec, codec_for, type_name
from .handles import SINGLE, OneJob, ResultHandle, Submission, SyncResultHandle

if TYPE_CHECKING:
    # The result's type parameter defaults to Any, so `sepp.Task[Order]` keeps meaning what it
    # meant before tasks had results (PEP 696; typing_extensions' TypeVar is read by type
    # checkers only: at run time `Task[Order]` is filled in by __class_getitem__ below).
    from typing_extensions import TypeVar as TypeVarWithDefault

    from .._client.client import Client
    from .._client.sync import SyncClient

    R = TypeVarWithDefault("R", default=Any)
else:
    R = TypeVar("R")

T = TypeVar("T")


class JobOptions(TypedDict, total=False):
    """What `Task.request` (and `job`, `submit`) take besides the payload: overrides of the
    task's defaults, and the job's own fields."""

    queue: str | None
    idempotency_key: str | None
    priority: int | None
    max_attempts: int | None
    custom: Mapping[str, v.CustomValue] | None
    scheduled_at: datetime | None
    trace_context: TraceContext | None


class Task(Generic[T, R]):
    """A job type whose payloads are `payload_type` objects, and whose handler returns a
    `result` (None: nothing that is read):
    `send_welcome = sepp.Task("emails", "send_welcome", Welcome, max_attempts=3)`,
    `resize = sepp.Task("images", "resize", Image, result=Thumbnail)`.

    Producers call `await send_welcome.enqueue(client, Welcome(...))`, or from blocking code
    `send_welcome.enqueue(sync_client, Welcome(...))` with a `sepp.SyncClient` (`request(...)`
    builds the EnqueueRequest, for `enqueue_batch` or any client's `enqueue`); `submit` enqueues
    and returns a handle whose `result()` is the handler's return value; `job(payload)` is a
    job to put in a `sepp.chain`, a `sepp.group` or `ctx.then`. Workers register
    `@router.task(send_welcome)` on `async def handle(job: Welcome, ctx: sepp.JobContext)`
    (returning a `result` object for a task with one). Payloads and results go through
    `codec` (default: pydantic's for a pydantic model, msgspec's for a msgspec Struct, else
    `sepp.JsonCodec`; picked by each one's type). `priority`, `max_attempts` and `custom` are
    the defaults of every enqueue; per-call values override them. A payload that does not
    decode is dead-lettered at once (`on_invalid="dead_letter"`) or nacked for a retry after
    the handler's backoff (`"retry"`).

    It is generic in its payload and result types: `resize` is a
    `sepp.Task[Image, Thumbnail]`, `send_welcome` a `sepp.Task[Welcome, None]`, and
    `sepp.Task[Welcome]` means `sepp.Task[Welcome, Any]`.
    """

    __slots__ = (
        "_codec",
        "_result_codec",
        "custom",
        "job_type",
        "max_attempts",
        "on_invalid",
        "payload_type",
        "priority",
        "queue",
        "result_type",
    )

    @overload
    def __init__(
        self: Task[T, None],
        queue: str,
        job_type: str,
        payload_type: type[T],
        *,
        result: None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
        codec: PayloadCodec | None = None,
        on_invalid: OnInvalid = "dead_letter",
    ) -> None: ...

    @overload
    def __init__(
        self: Task[T, R],
        queue: str,
        job_type: str,
        payload_type: type[T],
        *,
        result: type[R],
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, v.CustomValue] | None = None,
        codec: PayloadCodec | None = None,
        on_invalid: OnInvalid = "dead_letter",
    ) -> None: ...

    def __init__(
        self,
        queue: str,
        job_type: str,
        payload_type: type[Any],
        *,
        result: type[Any] | None = None,
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
        self.payload_type: type[T] = payload_type
        self.priority = priority
        self.max_attempts = max_attempts
        self.custom: Mapping[str, v.CustomValue] = dict(custom or {})
        self.on_invalid = check_on_invalid(on_invalid)
        self._codec = codec if codec is not None else codec_for(payload_type)
        self.result_type: type[R] | None = result
        self._result_codec: PayloadCodec
        if codec is not None:
            self._result_codec = codec
        elif result is not None:
            self._result_codec = codec_for(result)
        else:
            self._result_codec = _JSON

    if not TYPE_CHECKING:

        def __class_getitem__(cls, params):
            # `sepp.Task[Order]` at run time (annotations evaluated, aliases) is
            # `sepp.Task[Order, Any]`, as type checkers read it.
            if not isinstance(params, tuple):
                params = (params, Any)
            return super().__class_getitem__(params)

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

    def encode_result(self, value: R) -> Payload | None:
        """What a handler returned, as the payload its result travels in (None: no payload,
        for None); ValidationError (field "result") if it is not a `result` object or the
        codec cannot encode it."""
        result_type = self.result_type
        if value is None and result_type is None:
            return None
        if result_type is not None and not _is_instance(value, result_type):
            raise ValidationError(
                "result",
                f"the handler of task {self.job_type!r} returns {type_name(result_type)},"
                f" got {type(value).__qualname__}",
            )
        if value is None:
            return None
        try:
            return self._result_codec.encode(value)
        except SeppError:
            raise
        except Exception as exc:
            raise ValidationError(
                "result", f"{self._result_codec!r} cannot encode this result: {describe(exc)}"
            ) from exc

    def decode_result(self, payload: Payload | None) -> R:
        """A result's payload as a `result` object (None for a task without a result type);
        raises PayloadDecodeError."""
        if self.result_type is None:
            return None  # type: ignore[return-value]
        return self._result_codec.decode(payload, self.result_type)

    def job(self, payload: T, **options: Unpack[JobOptions]) -> TaskJob[T, R]:
        """One job of this task, not yet enqueued: the first step of a `sepp.chain`, a member
        of a `sepp.group`, or a follow-up for `ctx.then`. `options` are `request`'s (`queue`,
        `idempotency_key`, `priority`, `max_attempts`, `custom`, `scheduled_at`,
        `trace_context`); checked now, as `request` checks them."""
        return TaskJob(self, self.request(payload, **options))

    @overload
    def submit(
        self,
        client: SyncClient,
        payload: T,
        *,
        result_ttl: float | timedelta = p.DEFAULT_RESULT_TTL_S,
        **options: Unpack[JobOptions],
    ) -> SyncResultHandle[R]: ...

    @overload
    def submit(
        self,
        client: Client,
        payload: T,
        *,
        result_ttl: float | timedelta = p.DEFAULT_RESULT_TTL_S,
        **options: Unpack[JobOptions],
    ) -> Coroutine[Any, Any, ResultHandle[R]]: ...

    def submit(
        self,
        client: Client | SyncClient,
        payload: T,
        *,
        result_ttl: float | timedelta = p.DEFAULT_RESULT_TTL_S,
        **options: Unpack[JobOptions],
    ) -> ResultHandle[R] | SyncResultHandle[R] | Coroutine[Any, Any, ResultHandle[R]]:
        """Enqueue one job of this task and return a handle on its result:
        `thumb = await (await resize.submit(client, image)).result(timeout=10)`; with a
        `sepp.SyncClient`, `resize.submit(sync_client, image).result(timeout=10)`. The result
        comes back on this client's own reply queue (made at the first submit); a worker
        sends none after `result_ttl` (seconds or timedelta, at most a day), when the
        handle's `result()` gives up. `options` as for `job` (and `enqueue`)."""
        return self.job(payload, **options).submit(client, result_ttl=result_ttl)

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
        client = either_client(
            client,
            "Task.enqueue(client, payload)",
            f"; with another client, call its enqueue(task.request(payload)) ({self!r})",
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
        if self.result_type is not None:
            name += f" -> {getattr(self.result_type, '__qualname__', repr(self.result_type))}"
        return f"<sepp.Task {self.job_type!r} on {self.queue!r}: {name}>"

    def _step(self) -> p.StepSpec:
        """This task as a chain step after the first (its payload: the step before's result)."""
        return p.StepSpec(self.queue, self.job_type, self.priority, self.max_attempts, self.custom)


_JSON = JsonCodec()


class TaskJob(OneJob[R], Generic[T, R]):
    """One job of a task, built and checked but not yet enqueued: `resize.job(image)`. The
    first step of a `sepp.chain`, a member of a `sepp.group`, or a follow-up
    (`ctx.then(notify.job(note))`); `enqueue` and `submit` send it alone."""

    __slots__ = ("request", "task")

    def __init__(self, task: Task[T, R], request: EnqueueRequest) -> None:
        self.task = task
        self.request = request

    def _enqueue_requests(self) -> list[EnqueueRequest]:
        return [self.request]

    def _submission(self) -> Submission:
        return Submission([self.request], [self.task.decode_result], SINGLE)

    def __repr__(self) -> str:
        return f"<sepp.TaskJob {self.task.job_type!r} on {self.request.queue!r}>"


def _is_instance(value: object, payload_type: object) -> bool:
    """Whether `value` can be a `payload_type` (True where isinstance cannot tell: a
    TypedDict, a generic alias, a union, Any). An int is a float, as for type checkers."""
    if payload_type is float and isinstance(value, int):
        return True
    try:
        return isinstance(value, payload_type)  # type: ignore[arg-type]
    except TypeError:
        return True
