"""A `def` handler's ctx: annotated `sepp.SyncJobContext`, its client blocks as far as a type
checker knows (no coroutine to forget); an async handler cannot take one (test_typing.py:
the lines mypy must refuse carry `# type: ignore[code]`)."""

from __future__ import annotations

from dataclasses import dataclass

import sepp

router = sepp.Router()


@dataclass
class Welcome:
    user: int


send_welcome = sepp.Task("emails", "send_welcome", Welcome)


@router.handler("order")
def order(payload: sepp.Payload | None, ctx: sepp.SyncJobContext) -> None:
    ack: sepp.EnqueueAck = ctx.client.enqueue("shipping", "ship", payload=payload)
    sent: sepp.EnqueueAck = send_welcome.enqueue(ctx.client, Welcome(1))
    client: sepp.SyncClient = ctx.client
    plain: sepp.JobContext = ctx  # still a JobContext
    assert ack.job_id and sent.job_id and client and plain


@router.handler("untyped")
def untyped(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...


@router.task(send_welcome)
def welcome(job: Welcome, ctx: sepp.SyncJobContext) -> None:
    ctx.client.enqueue("emails", "sent")


@router.handler("async")  # type: ignore[type-var]
async def async_with_a_sync_ctx(payload: sepp.Payload | None, ctx: sepp.SyncJobContext) -> None:
    pass


async def awaits_the_blocking_client(ctx: sepp.SyncJobContext) -> None:
    await ctx.client.enqueue("q", "t")  # type: ignore[misc]


def on_a_worker(worker: sepp.Worker) -> None:
    worker.handle("order", order)

    @worker.task(send_welcome)
    def threaded(job: Welcome, ctx: sepp.SyncJobContext) -> None: ...
