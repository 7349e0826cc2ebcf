"""Typed jobs against the real sepp server: dataclass, pydantic and msgspec payloads round-trip
through a Worker, and a poison payload is dead-lettered once, with its reason, and logged once."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pydantic
import pytest
import trio
from fixtures.interpreters import available

import sepp
from sepp.testing import sepp_server

if available("msgspec"):
    import msgspec

QUEUE = "typed"
CONFIG = {
    "admin": {"enabled": False},
    "storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 600_000},
}


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    qty: int = 1


@dataclasses.dataclass(frozen=True)
class Order:
    id: uuid.UUID
    placed_at: datetime
    total: Decimal
    lines: list[Line]
    note: str | None = None


class PydanticOrder(pydantic.BaseModel):
    id: uuid.UUID
    lines: list[str]


if available("msgspec"):

    class MsgspecOrder(msgspec.Struct):
        id: str
        lines: list[str]


ORDER = Order(
    uuid.UUID(int=1), datetime(2026, 1, 1, tzinfo=timezone.utc), Decimal("9.99"), [Line("a")]
)


def msgspec_case(form: str) -> tuple[sepp.Task[Any], object] | tuple[None, None]:
    if not available("msgspec"):
        return None, None
    # JSON by the codec the model picks; MessagePack by the codec given.
    codec = sepp.MsgspecCodec("msgpack") if form == "msgpack" else None
    return sepp.Task(QUEUE, f"msgspec_{form}", MsgspecOrder, codec=codec), MsgspecOrder(form, [])


CASES = [
    pytest.param(sepp.Task(QUEUE, "dataclass", Order), ORDER, id="dataclass"),
    pytest.param(
        sepp.Task(QUEUE, "pydantic", PydanticOrder),
        PydanticOrder(id=uuid.UUID(int=2), lines=["b"]),
        id="pydantic",
    ),
    *(
        pytest.param(*msgspec_case(form), marks=pytest.mark.needs("msgspec"), id=f"msgspec_{form}")
        for form in ("json", "msgpack")
    ),
]


async def run_until(worker: sepp.Worker, done: trio.Event) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(15):
            await done.wait()
        worker.shutdown()


@pytest.mark.parametrize(("task", "value"), CASES)
async def test_typed_payloads_round_trip_through_the_server(
    task: sepp.Task[Any], value: object
) -> None:
    async with sepp_server(CONFIG) as server, sepp.open(server.address) as client:
        received: list[object] = []
        done = trio.Event()
        worker = sepp.Worker(client, QUEUE, wait_timeout=1)

        @worker.task(task)
        async def handle(job: Any, ctx: sepp.JobContext) -> None:
            received.append(job)
            done.set()

        ack = await task.enqueue(client, value, idempotency_key="once")
        await client.enqueue_batch([task.request(value, idempotency_key="once")])  # a duplicate
        await run_until(worker, done)
        assert received == [value]
        assert ack.job_id


async def test_a_poison_payload_is_dead_lettered_once_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = sepp.Task(QUEUE, "order", Order, max_attempts=5)
    async with sepp_server(CONFIG) as server, sepp.open(server.address) as client:
        nacked = trio.Event()
        ran: list[Order] = []

        class Spy:
            """The real client, noting the nack."""

            def __getattr__(self, name: str) -> Any:
                return getattr(client, name)

            async def nack(self, ctx: sepp.JobContext, **kwargs: Any) -> bool:
                dead = await client.nack(ctx, **kwargs)
                nacked.set()
                return dead

        worker = sepp.Worker(Spy(), QUEUE, wait_timeout=1, logger=logging.getLogger("t.poison"))  # type: ignore[arg-type]

        @worker.task(task)
        async def handle(job: Order, ctx: sepp.JobContext) -> None:
            ran.append(job)

        # What an old producer, or another client, might send: a field of the wrong type.
        bad = sepp.Payload.json({"id": "not-a-uuid", "placed_at": "2026-01-01", "total": "1"})
        job = await client.enqueue(QUEUE, "order", payload=bad, max_attempts=5)
        with caplog.at_level(logging.INFO, logger="t.poison"):
            await run_until(worker, nacked)
        (record,) = await client.drain_dead_letters(QUEUE)
        assert record.job_id == job.job_id
        assert record.cause is sepp.DeadLetterCause.REJECTED
        assert record.final_attempt == 1  # not retried, although 5 attempts were allowed
        assert record.last_reason == (
            "task 'order': payload does not decode into Order: $.id: expected a UUID,"
            " got 'not-a-uuid'"
        )
        assert ran == []
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and record.last_reason in errors[0]
