"""Limits as a type checker sees them: `limit=` takes a `sepp.Limit` or a list of them, on a
registration, a Router and `@task`; `ctx.limits` is a tuple of `sepp.LimitStats`;
`ctx.logical_attempt` an int; the Worker's `limit_waiting` and `limit_patience`
(test_typing.py: the lines mypy must refuse carry `# type: ignore[code]`)."""

from __future__ import annotations

from datetime import timedelta

import sepp

per_tenant = sepp.Limit(concurrency=1, key=lambda ctx: ctx.custom["tenant"], scope="global")
router = sepp.Router(limit=sepp.Limit(concurrency=4, name="crm"))
sepp.Router(limit=[per_tenant, sepp.Limit(rate="10/s")])
sepp.Router(limit="10/s")  # type: ignore[arg-type]
sepp.Limit(concurrency=1, scope="fleet")  # type: ignore[arg-type]
welcome = sepp.Task("emails", "welcome", dict)


@router.handler("sync", limit=per_tenant)
async def sync(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
    stats: tuple[sepp.LimitStats, ...] = ctx.limits
    running: int = stats[0].running
    attempt: int = ctx.logical_attempt + ctx.logical_max_attempts
    print(running, attempt)


@router.task(welcome, limit=sepp.Limit(rate=5, per=timedelta(seconds=1)))
def send(job: dict[str, object], ctx: sepp.SyncJobContext) -> None:
    print(ctx.limits[0].waiting)


async def main(client: sepp.Client) -> None:
    worker = sepp.Worker(client, "q", handlers=router, limit_waiting=4, limit_patience=None)
    worker.handle("other", sync, limit=sepp.Limit(concurrency=2))
    sepp.Worker(client, "q", limit_patience="5s")  # type: ignore[arg-type]
