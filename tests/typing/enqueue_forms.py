"""`Client.enqueue` takes an EnqueueRequest or a job's fields, never both (test_typing.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import sepp


async def forms(client: sepp.Client, request: sepp.EnqueueRequest) -> None:
    ack: sepp.EnqueueAck = await client.enqueue(request)
    ack = await client.enqueue(request, timeout=5)
    ack = await client.enqueue(
        "q",
        "t",
        payload=sepp.Payload.text("x"),
        idempotency_key="k",
        priority=9,
        max_attempts=3,
        custom={"n": 1},
        scheduled_at=datetime.now(timezone.utc),
        timeout=1.5,
    )
    assert ack.job_id

    await client.enqueue(request, priority=9)  # type: ignore[call-overload]
    await client.enqueue(request, payload=sepp.Payload.text("x"))  # type: ignore[call-overload]
    await client.enqueue(request, "t")  # type: ignore[call-overload]
    await client.enqueue("q")  # type: ignore[call-overload]
    await client.enqueue("q", "t", 9)  # type: ignore[call-overload]
