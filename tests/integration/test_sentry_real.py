"""`sepp.contrib.sentry` against the real server, with sentry-sdk's own transport interface
catching what would be sent (no network): a scope per job, tagged; one event per
dead-lettered job, in the scope it ran in; nothing for a retried failure or a
`HandlerError.retry`; and no second event from the worker's ERROR line about it (sentry-sdk's
logging integration would make one)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import sentry_sdk
import trio
from sentry_sdk.envelope import Envelope
from sentry_sdk.integrations.logging import LoggingIntegration
from sentry_sdk.transport import Transport

import sepp
from sepp.contrib.sentry import SentryMiddleware
from sepp.testing import SeppServer
from tests.integration.test_def_handlers_real import on

GUARD_S = 30  # bounds a hung test only; never part of an assertion
QUEUE = "payments"


class CapturingTransport(Transport):
    """sentry-sdk's transport interface, keeping every event instead of sending it."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope:
            if item.headers.get("type") == "event" and item.payload.json is not None:
                with self.lock:
                    self.events.append(item.payload.json)


@pytest.fixture
def transport() -> Iterator[CapturingTransport]:
    transport = CapturingTransport()
    # ERROR lines as events: sentry-sdk 2's default, an option in 3 (which has it off).
    logs = LoggingIntegration(event_level=logging.ERROR)
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=transport, integrations=[logs])
    try:
        yield transport
    finally:
        sentry_sdk.init()  # no DSN: off again for the tests that follow


def tags(event: dict[str, Any]) -> dict[str, str]:
    raw = event.get("tags", {})
    return dict(raw) if isinstance(raw, dict) else {k: v for k, v in raw}


@pytest.mark.parametrize("front", ["trio", "asyncio"])
async def test_one_event_per_dead_letter_in_its_jobs_scope_and_none_for_a_retry(
    sepp_server: SeppServer, transport: CapturingTransport, front: str
) -> None:
    sentry = SentryMiddleware()
    app_log = logging.getLogger("payments.app")
    ended = threading.Event()
    settled: list[str] = []

    async def count_settled(ctx: sepp.JobContext, exc: Exception | None) -> None:
        settled.append(ctx.job_type)

    async def charge(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        app_log.warning("charging, attempt %d", ctx.attempt)  # a breadcrumb of this attempt
        await anyio.lowlevel.checkpoint()
        raise ValueError(f"card declined on attempt {ctx.attempt}")

    async def flaky(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        if ctx.attempt == 1:
            raise ConnectionError("first try fails")  # retried: never reported

    async def later(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        if ctx.attempt == 1:
            raise sepp.HandlerError.retry("come back")  # retried: never reported

    async def refund(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise sepp.HandlerError.permanent("no such charge")

    def receipt(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        sentry_sdk.capture_message("captured in a def handler")  # in the job's scope
        ended.set()

    async def scenario() -> None:
        async with sepp.open(sepp_server.address) as client:
            hooks = sepp.Router(on_dead_letter=count_settled)  # after sentry's own hook
            hooks.handle("charge", charge).handle("flaky", flaky).handle("later", later)
            hooks.handle("refund", refund).handle("receipt", receipt)
            worker = sepp.Worker(
                client,
                QUEUE,
                handlers=hooks,
                wait_timeout=1,
                backoff=sepp.Retry.DEFAULT,
                unknown_types="dead_letter",
                middleware=[sentry],
                on_dead_letter=sentry.on_dead_letter,
            )
            await client.enqueue(QUEUE, "charge", max_attempts=2)
            for job_type in ("flaky", "later", "refund", "receipt", "no_such_type"):
                await client.enqueue(QUEUE, job_type)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(worker.run)
                with anyio.fail_after(GUARD_S):
                    while len(settled) < 2 or not ended.is_set():  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                    # The unknown type is the Worker's alone (no router's hook sees it).
                    while not any(e.get("level") == "error" for e in list(transport.events)):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                while await client.reserve(QUEUE, wait_timeout=0) is not None:
                    pytest.fail("a job was left")  # pragma: no cover
                worker.shutdown()

    await on(front, scenario)
    events = list(transport.events)
    # The worker's ERROR lines reach Sentry through its logging integration; those about a
    # dead letter the hook reported are dropped, the one about a type without a handler is not
    # (logged once a minute: a worker that lacks a handler, not a job).
    lines = [e["logentry"]["message"] for e in events if e.get("logger") == "sepp.worker"]
    assert len(lines) == 1 and "has no handler for job type" in lines[0], lines
    events = [e for e in events if e.get("logger") != "sepp.worker"]
    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_type.setdefault(tags(event).get("sepp.job_type", "?"), []).append(event)
    assert sorted(by_type) == ["charge", "no_such_type", "receipt", "refund"], events
    assert all(len(found) == 1 for found in by_type.values()), events

    (charge_event,) = by_type["charge"]
    assert tags(charge_event)["sepp.attempt"] == "2"  # the final attempt only
    assert tags(charge_event)["sepp.queue"] == QUEUE and tags(charge_event)["sepp.job_id"]
    assert charge_event["transaction"] == "charge"
    assert charge_event["contexts"]["sepp job"]["max_attempts"] == 2
    (exception,) = charge_event["exception"]["values"]
    assert exception["type"] == "ValueError"
    assert exception["value"] == "card declined on attempt 2"
    assert (exception["mechanism"]["type"], exception["mechanism"]["handled"]) == ("sepp", False)
    crumbs = [c.get("message") for c in charge_event.get("breadcrumbs", {}).get("values", [])]
    assert "charging, attempt 2" in crumbs and "charging, attempt 1" not in crumbs

    (refund_event,) = by_type["refund"]
    assert refund_event["exception"]["values"][0]["type"] == "HandlerError"
    (unknown_event,) = by_type["no_such_type"]
    assert "dead-lettered" in unknown_event["message"] or "dead-lettered" in str(
        unknown_event.get("logentry")
    )
    (inside,) = by_type["receipt"]
    assert tags(inside)["sepp.job_type"] == "receipt" and "exception" not in inside
    assert sorted(settled) == ["charge", "refund"]


async def test_without_its_middleware_the_hook_reports_in_a_tagged_scope_of_its_own(
    sepp_server: SeppServer, transport: CapturingTransport
) -> None:
    sentry = SentryMiddleware()
    async with sepp.open(sepp_server.address) as client:
        worker = sepp.Worker(client, QUEUE, wait_timeout=1, on_dead_letter=sentry.on_dead_letter)

        @worker.handler("charge")
        async def charge(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            raise sepp.HandlerError.permanent("declined")

        await client.enqueue(QUEUE, "charge")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(GUARD_S):
                while not transport.events:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            worker.shutdown()
    (event,) = transport.events
    assert tags(event)["sepp.job_type"] == "charge" and tags(event)["sepp.attempt"] == "1"
    assert event["exception"]["values"][0]["mechanism"]["type"] == "sepp"


def test_import_sepp_does_not_import_sentry_sdk() -> None:
    import subprocess
    import sys

    code = "import sepp, sys; sepp.Worker; sepp.Router; print('sentry_sdk' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
