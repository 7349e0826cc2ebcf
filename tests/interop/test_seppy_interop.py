"""Interoperability with the official sepp-py client, both directions, on the real server."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import date, datetime, timedelta, timezone

import pytest
import trio
from opentelemetry import trace
from otel_support import install
from peers.seppy import b64, seppy_driver, typed_custom, unb64, untyped_custom

import sepp
from sepp.testing import SeppServer

DATA = b"\x00\x01 NUL and invalid UTF-8: \xff\xfe\xc3\x28 \x00"
CUSTOM = {"s": "x", "i": 1, "d": 1.5, "b": True, "big": 2**62}


async def test_job_from_sepp_trio_reads_identically_in_sepp_py(sepp_server: SeppServer) -> None:
    scheduled = datetime.now(timezone.utc) + timedelta(seconds=1)
    async with sepp.open(sepp_server.address) as client, seppy_driver(sepp_server.address) as py:
        ack = await client.enqueue(
            "interop",
            "convert",
            payload=sepp.Payload.bytes(DATA, "application/x-custom"),
            custom=CUSTOM,
            priority=7,
            max_attempts=5,
            scheduled_at=scheduled,
        )
        jobs = await py.call("reserve", queues=["interop"], lease_s=30, wait_s=10)
        assert jobs is not None and len(jobs) == 1
        job = jobs[0]
        assert job["id"] == ack.job_id
        assert unb64(job["payload_b64"]) == DATA
        assert job["encoding"] == "application/x-custom"
        custom = untyped_custom(job["custom"])
        assert custom == CUSTOM
        assert {k: v["t"] for k, v in job["custom"].items()} == {
            "s": "s",
            "i": "i",
            "d": "d",
            "b": "b",
            "big": "i",
        }
        assert (job["priority"], job["max_attempts"], job["attempt"]) == (7, 5, 1)
        got_scheduled = datetime.fromisoformat(job["scheduled_at"])
        assert abs(got_scheduled - scheduled) < timedelta(milliseconds=1)
        await py.call("ack", job_id=job["id"])


async def test_job_from_sepp_py_reads_identically_in_sepp_trio(sepp_server: SeppServer) -> None:
    scheduled = datetime.now(timezone.utc) + timedelta(seconds=1)
    async with sepp.open(sepp_server.address) as client, seppy_driver(sepp_server.address) as py:
        ack = await py.call(
            "enqueue",
            queue="interop2",
            job_type="convert",
            payload_b64=b64(DATA),
            encoding="application/x-custom",
            custom=typed_custom(CUSTOM),
            priority=7,
            max_attempts=5,
            scheduled_at=scheduled.isoformat(),
        )
        jobs = await client.reserve("interop2", wait_timeout=10)
        assert jobs is not None and len(jobs) == 1
        job = jobs[0]
        assert job.id == ack["job_id"]
        assert job.payload == sepp.Payload(DATA, "application/x-custom")
        assert job.ctx.custom == CUSTOM
        assert {k: type(v) for k, v in job.ctx.custom.items()} == {
            k: type(v) for k, v in CUSTOM.items()
        }
        assert (job.ctx.priority, job.ctx.max_attempts, job.ctx.attempt) == (7, 5, 1)
        assert job.ctx.scheduled_at is not None
        assert abs(job.ctx.scheduled_at - scheduled) < timedelta(milliseconds=1)
        await client.ack(job.ctx)


async def test_sepp_py_dead_letters_what_we_enqueued_and_we_drain_it(
    sepp_server: SeppServer,
) -> None:
    async with sepp.open(sepp_server.address) as client, seppy_driver(sepp_server.address) as py:
        ack = await client.enqueue("dlq", "t", payload=sepp.Payload.text("body"), priority=3)
        (job,) = await py.call("reserve", queues=["dlq"], lease_s=30, wait_s=5)
        assert (await py.call("nack", job_id=job["id"], retry="default", reason="later")) == {
            "dead_lettered": False
        }
        (again,) = await py.call("reserve", queues=["dlq"], lease_s=30, wait_s=5)
        assert again["attempt"] == 2
        result = await py.call("nack", job_id=job["id"], retry="dead_letter", reason="poison")
        assert result["dead_lettered"] is True
        (record,) = await client.drain_dead_letters("dlq", max=10)
        assert record.job_id == ack.job_id
        assert record.cause is sepp.DeadLetterCause.REJECTED
        assert record.last_reason == "poison" and record.final_attempt == 2
        assert record.payload == sepp.Payload.text("body") and record.priority == 3


async def test_we_dead_letter_what_sepp_py_enqueued_and_it_drains(
    sepp_server: SeppServer,
) -> None:
    async with sepp.open(sepp_server.address) as client, seppy_driver(sepp_server.address) as py:
        ack = await py.call("enqueue", queue="dlq2", job_type="t")
        jobs = await client.reserve("dlq2", wait_timeout=5)
        assert jobs is not None
        assert await client.nack(jobs[0].ctx, retry=sepp.Retry.DEAD_LETTER, reason="nope")
        records = await py.call("drain_dead_letters", queue="dlq2", max=10)
        assert [r["job_id"] for r in records] == [ack["job_id"]]
        assert records[0]["cause"] == "rejected"
        assert records[0]["last_reason"] == "nope"


async def test_stale_ack_after_sepp_py_took_the_job_over(sepp_server: SeppServer) -> None:
    async with sepp.open(sepp_server.address) as client, seppy_driver(sepp_server.address) as py:
        await client.enqueue("stale", "t")
        mine = await client.reserve("stale", lease_duration=0.2, wait_timeout=5)
        assert mine is not None
        theirs = await py.call("reserve", queues=["stale"], lease_s=30, wait_s=5)
        assert theirs is not None and theirs[0]["attempt"] == 2
        with pytest.raises(sepp.AttemptMismatchError):
            await client.ack(mine[0].ctx)
        await py.call("ack", job_id=theirs[0]["id"])


async def test_our_producer_span_links_to_sepp_py_process_span(sepp_server: SeppServer) -> None:
    exporter, _ = install()
    async with sepp.open(sepp_server.address) as client, seppy_driver(sepp_server.address) as py:
        with trace.get_tracer("test").start_as_current_span("http.request") as app:
            await client.enqueue("traced", "t")
        trace_id = f"{app.get_span_context().trace_id:032x}"
        with trio.fail_after(30):
            result = await py.call("process_one_traced", queue="traced", timeout_s=10)
        assert trace_id in result["link_trace_ids"]
        assert result["process_span"]["name"] == "sepp.process"
    assert any(s.name == "sepp.enqueue" for s in exporter.get_finished_spans())


@dataclasses.dataclass(frozen=True)
class Shipment:
    order: uuid.UUID
    ship_on: date
    items: list[str]
    express: bool = False


SHIP = sepp.Task("interop_typed", "ship", Shipment)


async def test_typed_jobs_are_plain_json_both_ways_with_sepp_py(sepp_server: SeppServer) -> None:
    """sepp-py reads a typed job's bytes as plain JSON, and a typed handler decodes the JSON a
    sepp-py producer enqueues (what a service written with sepp-py would send)."""
    sent = Shipment(uuid.UUID(int=5), date(2026, 3, 1), ["a", "b"])
    async with sepp.open(sepp_server.address) as client, seppy_driver(sepp_server.address) as py:
        await SHIP.enqueue(client, sent)
        (job,) = await py.call("reserve", queues=["interop_typed"], lease_s=30, wait_s=10)
        assert job["encoding"] == "application/json"
        document = json.loads(unb64(job["payload_b64"]))
        assert document == {
            "order": "00000000-0000-0000-0000-000000000005",
            "ship_on": "2026-03-01",
            "items": ["a", "b"],
            "express": False,
        }
        await py.call("ack", job_id=job["id"])

        # The sepp-py side enqueues its own JSON: keys in another order, a default left out.
        reply = {"items": [*document["items"], "c"], "ship_on": "2026-03-02", "order": "5" * 32}
        await py.call(
            "enqueue",
            queue="interop_typed",
            job_type="ship",
            payload_b64=b64(json.dumps(reply).encode()),
            encoding="application/json",
        )
        received: list[Shipment] = []
        worker = sepp.Worker(client, "interop_typed", wait_timeout=1)

        @worker.task(SHIP)
        async def ship(job: Shipment, ctx: sepp.JobContext) -> None:
            received.append(job)
            worker.shutdown()

        with trio.fail_after(15):
            await worker.run()
        assert received == [
            Shipment(uuid.UUID("5" * 32), date(2026, 3, 2), ["a", "b", "c"], express=False)
        ]
