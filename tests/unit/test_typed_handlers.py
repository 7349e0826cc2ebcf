"""Tasks, typed handlers and their registration checks, and poison payloads in the Worker
(scripted FakeClient on MockClock)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import warnings
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import msgspec
import pydantic
import pytest
import trio
from fixtures.fake_client import FakeClient, RecordingLogger
from trio.testing import MockClock

import sepp
from sepp.testing import job_context

if TYPE_CHECKING:
    from decimal import Decimal  # only for the checker: the annotation cannot be resolved


@dataclasses.dataclass(frozen=True)
class Welcome:
    user: int
    name: str = "friend"


@dataclasses.dataclass(frozen=True)
class Other:
    user: int


send_welcome = sepp.Task("emails", "send_welcome", Welcome, priority=5, max_attempts=3)


# -- Task: producing --------------------------------------------------------------------------


def test_request_carries_the_tasks_defaults_and_per_call_overrides() -> None:
    request = send_welcome.request(Welcome(42))
    assert (request.queue, request.job_type) == ("emails", "send_welcome")
    assert (request.priority, request.max_attempts, dict(request.custom)) == (5, 3, {})
    assert request.payload == sepp.Payload.json({"user": 42, "name": "friend"})
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    override = send_welcome.request(
        Welcome(1), queue="vip", priority=9, idempotency_key="k", scheduled_at=at, custom={"a": 1}
    )
    assert (override.queue, override.priority, override.max_attempts) == ("vip", 9, 3)
    assert (override.idempotency_key, override.scheduled_at, dict(override.custom)) == (
        "k",
        at,
        {"a": 1},
    )


class AsyncRecorder(sepp.Client):
    """A sepp.Client without a connection, recording what it is asked to enqueue."""

    def __init__(self) -> None:
        self.sent: list[tuple[sepp.EnqueueRequest, Any]] = []

    async def enqueue(self, request: sepp.EnqueueRequest, *, timeout: Any = None) -> Any:  # type: ignore[override]
        self.sent.append((request, timeout))
        return sepp.EnqueueAck("id-1")


class SyncRecorder(sepp.SyncClient):
    """A sepp.SyncClient without a connection, recording what it is asked to enqueue."""

    def __init__(self) -> None:
        self.sent: list[tuple[sepp.EnqueueRequest, Any]] = []

    def enqueue(self, request: sepp.EnqueueRequest, *, timeout: Any = None) -> Any:  # type: ignore[override]
        self.sent.append((request, timeout))
        return sepp.EnqueueAck("id-1")


async def test_enqueue_sends_the_tasks_request() -> None:
    client = AsyncRecorder()
    ack = await send_welcome.enqueue(client, Welcome(7), idempotency_key="k", timeout=2)
    assert ack == sepp.EnqueueAck("id-1")
    assert client.sent == [(send_welcome.request(Welcome(7), idempotency_key="k"), 2)]


def test_enqueue_through_a_sync_client_returns_the_ack_at_once() -> None:
    client = SyncRecorder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an un-awaited coroutine would warn
        ack = send_welcome.enqueue(client, Welcome(7), idempotency_key="k", timeout=2)
    assert ack == sepp.EnqueueAck("id-1")
    assert client.sent == [(send_welcome.request(Welcome(7), idempotency_key="k"), 2)]


def test_enqueue_through_another_object_raises_type_error_naming_the_alternative() -> None:
    class Duck:
        async def enqueue(self, request: sepp.EnqueueRequest, *, timeout: Any = None) -> Any:
            raise AssertionError("never called")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError) as info:
            send_welcome.enqueue(Duck(), Welcome(7))  # type: ignore[call-overload]
    message = str(info.value)
    assert "sepp.Client" in message and "sepp.SyncClient" in message and "Duck" in message
    assert "enqueue(task.request(payload))" in message


def test_enqueue_refuses_a_bad_payload_before_either_client_sends() -> None:
    sync, async_ = SyncRecorder(), AsyncRecorder()
    with pytest.raises(sepp.ValidationError, match="takes Welcome payloads, got dict"):
        send_welcome.enqueue(sync, {"user": 1})  # type: ignore[call-overload]
    with pytest.raises(sepp.ValidationError, match="takes Welcome payloads, got dict"):
        send_welcome.enqueue(async_, {"user": 1})  # type: ignore[call-overload]
    assert sync.sent == [] and async_.sent == []


def test_task_checks_its_defaults_and_options() -> None:
    with pytest.raises(sepp.ValidationError, match="priority"):
        sepp.Task("q", "t", Welcome, priority=10)
    with pytest.raises(sepp.ValidationError, match="queue"):
        sepp.Task("", "t", Welcome)
    with pytest.raises(sepp.ValidationError, match="on_invalid"):
        sepp.Task("q", "t", Welcome, on_invalid="drop")  # type: ignore[arg-type]
    with pytest.raises(sepp.ValidationError, match="codec"):
        sepp.Task("q", "t", Welcome, codec=object())  # type: ignore[arg-type]
    with pytest.raises(sepp.ValidationError, match="on_invalid"):
        sepp.Router(on_invalid="ignore")  # type: ignore[arg-type]


# -- registration checks ----------------------------------------------------------------------


async def one_argument(payload: sepp.Payload | None) -> None: ...


async def three_arguments(payload: Any, ctx: Any, extra: Any) -> None: ...


async def keyword_only(payload: Any, ctx: Any, *, flag: bool) -> None: ...


@pytest.mark.parametrize("fn", [one_argument, three_arguments, keyword_only])
@pytest.mark.parametrize("register", ["handle", "handler", "catch_all", "task", "worker"])
def test_handlers_that_cannot_take_payload_and_ctx_are_refused_at_registration(
    fn: Any, register: str
) -> None:
    router = sepp.Router()
    with pytest.raises(TypeError, match=r"handler\(payload, ctx\)") as info:
        if register == "handle":
            router.handle("t", fn)
        elif register == "handler":
            router.handler("t")(fn)
        elif register == "catch_all":
            router.catch_all(fn)
        elif register == "task":
            router.task(send_welcome)(fn)
        else:
            sepp.Worker(FakeClient(), "q").handle("t", fn)
    assert fn.__name__ in str(info.value)
    assert router.job_types == () and not router.has_catch_all


async def two(payload: Any, ctx: Any) -> None: ...


async def with_defaults(payload: Any, ctx: Any, extra: int = 0, *, flag: bool = False) -> None: ...


async def star_args(*args: Any) -> None: ...


class Callable_:
    async def __call__(self, payload: Any, ctx: Any) -> None: ...


@pytest.mark.parametrize(
    "fn",
    [two, with_defaults, star_args, functools.partial(three_arguments, 1), Callable_()],
)
def test_handlers_taking_two_positional_arguments_are_accepted(fn: Any) -> None:
    sepp.Router().handle("t", fn)


def test_a_plain_def_is_not_refused_for_its_parameters() -> None:
    # Whether a sync function may run is another check's business; its parameters are fine.
    from sepp._worker.typed_handler import prepare

    def sync(payload: Welcome, ctx: sepp.JobContext) -> None: ...

    adapted = prepare(sync, "t", "dead_letter")
    assert adapted(sepp.Payload.json({"user": 1}), job_context()) is None


def test_a_task_handler_annotated_with_another_type_is_refused() -> None:
    async def handle(job: Other, ctx: sepp.JobContext) -> None: ...

    with pytest.raises(TypeError, match="annotated Other, but the task's payloads are Welcome"):
        sepp.Router().task(send_welcome)(handle)  # type: ignore[arg-type]


def test_an_unresolvable_model_annotation_is_refused_with_advice() -> None:
    async def handle(job: Decimal, ctx: sepp.JobContext) -> None: ...

    with pytest.raises(TypeError, match=r"cannot resolve the annotation 'Decimal'.*Router.task"):
        sepp.Router().handle("t", handle)


@pytest.mark.parametrize("library", ["dataclass", "pydantic", "msgspec"])
@pytest.mark.parametrize("register", ["router", "worker"])
async def test_task_handlers_of_models_defined_in_a_function_register_and_decode(
    library: str, register: str, autojump_clock: MockClock
) -> None:
    # Under `from __future__ import annotations`, `job: Order` below is the string 'Order',
    # which cannot be resolved outside this function: the task says what it is.
    if library == "dataclass":

        @dataclasses.dataclass
        class Order:
            sku: str

    elif library == "pydantic":

        class Order(pydantic.BaseModel):  # type: ignore[no-redef]
            sku: str

    else:

        class Order(msgspec.Struct):  # type: ignore[no-redef]
            sku: str

    task = sepp.Task("q", "order", Order)
    seen: list[object] = []

    async def handle(job: Order, ctx: sepp.JobContext) -> None:
        seen.append(job)

    assert inspect.signature(handle).parameters["job"].annotation == "Order"
    fake = FakeClient()
    if register == "router":
        router = sepp.Router()
        router.task(task)(handle)
        worker = make_worker(fake, handlers=router)
    else:
        worker = make_worker(fake)
        worker.task(task)(handle)
    fake.add("order", sepp.Payload.json({"sku": "mug"}))
    await run_briefly(worker)
    assert seen == [Order(sku="mug")]
    assert len(fake.acks) == 1


@pytest.mark.parametrize("library", ["dataclass", "pydantic", "msgspec"])
def test_a_task_handler_annotated_with_another_local_type_is_refused_by_name(
    library: str,
) -> None:
    if library == "dataclass":

        @dataclasses.dataclass
        class Order:
            sku: str

        @dataclasses.dataclass
        class Refund:
            sku: str

    elif library == "pydantic":

        class Order(pydantic.BaseModel):  # type: ignore[no-redef]
            sku: str

        class Refund(pydantic.BaseModel):  # type: ignore[no-redef]
            sku: str

    else:

        class Order(msgspec.Struct):  # type: ignore[no-redef]
            sku: str

        class Refund(msgspec.Struct):  # type: ignore[no-redef]
            sku: str

    task = sepp.Task("q", "order", Order)

    async def handle(job: Refund, ctx: sepp.JobContext) -> None: ...

    for register in (sepp.Router().task(task), sepp.Worker(FakeClient(), "q").task(task)):
        with pytest.raises(
            TypeError, match=r"annotated 'Refund', but the task's payloads are .*Order"
        ):
            register(handle)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "annotation", ["Welcome", "shop.models.Welcome", "'Welcome'", "sepp.Payload | None", "Any"]
)
async def test_unresolvable_task_annotations_naming_the_type_or_the_raw_payload_are_accepted(
    annotation: str,
) -> None:
    seen: list[object] = []

    async def handle(job: Any, ctx: Any) -> None:
        seen.append(job)

    # Strings that do not resolve where the handler lives (ctx's makes sure of it).
    handle.__annotations__.update(job=annotation, ctx="missing_name")
    router = sepp.Router()
    router.task(send_welcome)(handle)
    handler = router.lookup("send_welcome")
    assert handler is not None
    await handler(sepp.Payload.json({"user": 1}), job_context())
    assert seen == [Welcome(1)]  # decoded by the task, whatever the annotation says


class Plain:
    pass


def test_a_model_type_the_json_codec_cannot_decode_is_refused() -> None:
    async def handle(job: Plain, ctx: sepp.JobContext) -> None: ...

    with pytest.raises(TypeError, match="handler for 't': the JSON codec cannot decode"):
        sepp.Router().handle("t", handle)


# -- what a handler receives ------------------------------------------------------------------


async def test_raw_handlers_are_registered_as_they_are() -> None:
    async def raw(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

    async def bare(payload, ctx):  # type: ignore[no-untyped-def]
        ...

    router = sepp.Router().handle("raw", raw).handle("bare", bare)
    assert router.lookup("raw") is raw and router.lookup("bare") is bare


class TypedCallable:
    def __init__(self) -> None:
        self.seen: list[Welcome] = []

    async def __call__(self, job: Welcome, ctx: sepp.JobContext) -> None:
        self.seen.append(job)


async def test_async_callable_objects_and_partials_keep_an_async_adapter() -> None:
    obj = TypedCallable()

    async def three(prefix: str, job: Welcome, ctx: sepp.JobContext) -> None:
        obj.seen.append(job)

    router = sepp.Router().handle("obj", obj).handle("partial", functools.partial(three, "p"))
    for job_type in ("obj", "partial"):
        handler = router.lookup(job_type)
        assert handler is not None and inspect.iscoroutinefunction(handler)
        await handler(sepp.Payload.json({"user": 1}), job_context(job_type))
    assert obj.seen == [Welcome(1), Welcome(1)]


async def test_an_unresolvable_payload_annotation_still_means_the_raw_payload() -> None:
    namespace: dict[str, Any] = {}  # `sepp` is not defined where the handler lives
    exec("async def handle(payload: 'sepp.Payload | None', ctx: 'sepp.JobContext'): ...", namespace)
    router = sepp.Router().handle("t", namespace["handle"])
    assert router.lookup("t") is namespace["handle"]


class PydanticWelcome(pydantic.BaseModel):
    user: int


class MsgspecWelcome(msgspec.Struct):
    user: int


@pytest.mark.parametrize("model", [PydanticWelcome, MsgspecWelcome, dict])
async def test_annotated_handlers_use_the_codec_of_their_models_library(model: Any) -> None:
    seen: list[object] = []

    async def handle(job: Any, ctx: sepp.JobContext) -> None:
        seen.append(job)

    handle.__annotations__["job"] = model
    router = sepp.Router().handle("t", handle)
    handler = router.lookup("t")
    assert handler is not None and handler is not handle
    await handler(sepp.Payload.json({"user": 1}), job_context("t"))
    assert seen == [model(user=1)]
    with pytest.raises(sepp.HandlerError, match="payload does not decode into"):
        await handler(sepp.Payload.json([]), job_context("t"))


async def test_annotated_handlers_and_task_handlers_get_decoded_payloads() -> None:
    seen: list[object] = []
    router = sepp.Router()

    @router.handler("plain")
    async def plain(job: Welcome, ctx: sepp.JobContext) -> None:
        seen.append(job)

    @router.task(send_welcome)
    async def task(job: Welcome, ctx: sepp.JobContext) -> None:
        seen.append(job)

    for job_type in ("plain", "send_welcome"):
        handler = router.lookup(job_type)
        assert handler is not None
        await handler(sepp.Payload.json({"user": 1}), job_context(job_type))
    assert seen == [Welcome(1), Welcome(1)]


async def test_a_payload_that_does_not_decode_is_a_permanent_handler_error() -> None:
    called = []
    router = sepp.Router()

    @router.task(send_welcome)
    async def handle(job: Welcome, ctx: sepp.JobContext) -> None:
        called.append(job)

    handler = router.lookup("send_welcome")
    assert handler is not None
    with pytest.raises(sepp.HandlerError) as info:
        await handler(sepp.Payload.json({"user": "x"}), job_context())
    assert info.value.directive == sepp.Retry.DEAD_LETTER
    assert info.value.reason == (
        "task 'send_welcome': payload does not decode into Welcome: $.user: expected integer,"
        " got string"
    )
    assert called == []


# -- poison payloads in the Worker ------------------------------------------------------------


def make_worker(fake: FakeClient, **options: Any) -> sepp.Worker:
    return sepp.Worker(fake, "q", _wall_clock=fake.now, **options)


async def run_briefly(worker: sepp.Worker) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(5)
        worker.shutdown()


@pytest.mark.parametrize(
    "payload",
    [
        sepp.Payload(b"{not json", "application/json"),
        sepp.Payload.json({"name": "x"}),  # the required field is missing
        sepp.Payload.json({"user": "42"}),  # the wrong type
        sepp.Payload.text('{"user": 42}'),  # the wrong content type
        None,
    ],
)
async def test_poison_payloads_are_dead_lettered_at_once_and_logged_once(
    payload: sepp.Payload | None, autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, logger=logging.getLogger("test.poison"))
    ran: list[Welcome] = []

    @worker.task(send_welcome)
    async def handle(job: Welcome, ctx: sepp.JobContext) -> None:
        ran.append(job)

    fake.add("send_welcome", payload, max_attempts=5)
    with caplog.at_level(logging.DEBUG, logger="test.poison"):
        await run_briefly(worker)
    ((nack),) = fake.nacks
    assert nack.retry == sepp.Retry.DEAD_LETTER
    assert nack.reason is not None
    assert nack.reason.startswith("task 'send_welcome': payload does not decode into Welcome: ")
    assert ran == [] and fake.acks == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert nack.reason in errors[0].getMessage()
    assert "dead-lettered" in errors[0].getMessage()


@pytest.mark.parametrize("where", ["router", "task"])
async def test_on_invalid_retry_nacks_for_a_retry_after_the_backoff(
    where: str, autojump_clock: MockClock
) -> None:
    fake = FakeClient()
    router = sepp.Router(on_invalid="retry" if where == "router" else "dead_letter")
    retrying = sepp.Task("q", "work", Welcome, on_invalid="retry")
    if where == "router":

        @router.handler("work")
        async def handle(job: Welcome, ctx: sepp.JobContext) -> None: ...

    else:

        @router.task(retrying)
        async def handle_task(job: Welcome, ctx: sepp.JobContext) -> None: ...

    logger = RecordingLogger()
    worker = make_worker(fake, handlers=router, logger=logger)
    fake.add("work", sepp.Payload.json({}), max_attempts=1)
    await run_briefly(worker)
    ((nack),) = fake.nacks
    assert nack.retry is not None and nack.retry.kind == "delay"  # the Worker's backoff
    (message,) = logger.at("error")  # its only attempt: the retry dead-lettered it
    assert "payload does not decode into Welcome" in message and "dead-lettered" in message
