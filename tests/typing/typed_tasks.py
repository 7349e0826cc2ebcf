"""`sepp.Task[T]`: producers must enqueue a T, and a task's handler must take a T
(test_typing.py: the lines mypy must refuse carry `# type: ignore[code]`)."""

from __future__ import annotations

from dataclasses import dataclass

import sepp


@dataclass
class Welcome:
    user: int


@dataclass
class NotWelcome:
    account: str


send_welcome = sepp.Task("emails", "send_welcome", Welcome, priority=5)
router = sepp.Router()


async def produce(client: sepp.Client) -> None:
    ack: sepp.EnqueueAck = await send_welcome.enqueue(client, Welcome(42), idempotency_key="k")
    request: sepp.EnqueueRequest = send_welcome.request(Welcome(1), priority=9)
    await client.enqueue_batch([request, send_welcome.request(Welcome(2))])
    assert ack.job_id
    welcome: Welcome = send_welcome.decode(send_welcome.encode(Welcome(3)))
    assert welcome.user == 3

    await send_welcome.enqueue(client, NotWelcome("a"))  # type: ignore[call-overload]
    send_welcome.request(NotWelcome("a"))  # type: ignore[arg-type]
    send_welcome.request({"user": 42})  # type: ignore[arg-type]
    await send_welcome.enqueue(client, Welcome(1), colour="red")  # type: ignore[call-overload]


def produce_blocking(client: sepp.SyncClient) -> None:
    ack: sepp.EnqueueAck = send_welcome.enqueue(client, Welcome(42), idempotency_key="k")
    assert ack.job_id
    client.enqueue(send_welcome.request(Welcome(1)))  # the form any client takes
    send_welcome.enqueue(client, NotWelcome("a"))  # type: ignore[call-overload]


async def awaits_the_blocking_form(client: sepp.SyncClient) -> None:
    await send_welcome.enqueue(client, Welcome(1))  # type: ignore[misc]


async def forgets_to_await(client: sepp.Client) -> None:
    ack: sepp.EnqueueAck = send_welcome.enqueue(client, Welcome(1))  # type: ignore[assignment]
    assert ack


def neither_client(other: object) -> None:
    send_welcome.enqueue(other, Welcome(1))  # type: ignore[call-overload]


@router.task(send_welcome)
async def handle(job: Welcome, ctx: sepp.JobContext) -> None:
    assert job.user >= 0


@router.task(send_welcome)
async def takes_anything(job: object, ctx: sepp.JobContext) -> None: ...


@router.task(send_welcome)  # type: ignore[arg-type]
async def wrong_type(job: NotWelcome, ctx: sepp.JobContext) -> None: ...


@router.task(send_welcome)  # type: ignore[arg-type]
async def one_argument(job: Welcome) -> None: ...


@router.task(send_welcome)  # type: ignore[arg-type]
def not_awaitable(job: Welcome, ctx: sepp.JobContext) -> int:
    return 0


@router.handler("plain_typed")
async def plain_typed(job: Welcome, ctx: sepp.JobContext) -> None: ...


@router.handler("raw")
async def raw(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...


codec: sepp.PayloadCodec = sepp.JsonCodec()
codec = sepp.PydanticCodec()
codec = sepp.MsgspecCodec("msgpack")
decoded: Welcome = codec.decode(None, Welcome)
sepp.MsgspecCodec("yaml")  # type: ignore[arg-type]


@router.task(send_welcome)
def in_a_thread(job: Welcome, ctx: sepp.JobContext) -> None:
    assert job.user >= 0


@router.task(send_welcome)  # type: ignore[arg-type]
def thread_wrong_type(job: NotWelcome, ctx: sepp.JobContext) -> None: ...


def on_a_worker(worker: sepp.Worker) -> None:
    @worker.task(send_welcome)
    def threaded(job: Welcome, ctx: sepp.JobContext) -> None: ...

    @worker.task(send_welcome)  # type: ignore[arg-type]
    def wrong(job: NotWelcome, ctx: sepp.JobContext) -> None: ...
