"""The failure policy and the dead-letter hook as a type checker sees them: `retry_on` and
`give_up_on` take an exception class or a tuple of them; `on_dead_letter` an `async def` or a
`def` of `(ctx, exc)`, a `def` one's ctx a `sepp.SyncJobContext` (test_typing.py: the lines
mypy must refuse carry `# type: ignore[code]`)."""

from __future__ import annotations

import sepp
from sepp.contrib.sentry import SentryMiddleware


async def told(ctx: sepp.JobContext, exc: Exception | None) -> None:
    print(ctx.id, exc)


def told_in_a_thread(ctx: sepp.SyncJobContext, exc: Exception | None) -> None:
    ctx.client.enqueue("compensations", "refund")  # blocking: returns the ack


def wrong_shape(ctx: sepp.JobContext) -> None: ...


sentry = SentryMiddleware()
router = sepp.Router(
    retry_on=(ConnectionError, TimeoutError),
    give_up_on=ValueError,
    on_dead_letter=told,
    middleware=[sentry],
)
sepp.Router(on_dead_letter=told_in_a_thread)
sepp.Router(on_dead_letter=sentry.on_dead_letter)
sepp.Router(on_dead_letter=wrong_shape)  # type: ignore[arg-type]
sepp.Router(retry_on="ConnectionError")  # type: ignore[arg-type]
sepp.Router(give_up_on=[ValueError])  # type: ignore[arg-type]


@router.handler("charge", give_up_on=(KeyError,))
async def charge(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...


async def main(client: sepp.Client) -> None:
    worker = sepp.Worker(client, "q", handlers=router, retry_on=(), on_dead_letter=told)
    worker.pause()
    paused: bool = worker.is_paused
    worker.resume()
    print(paused)
