"""The Worker's tracing and metrics: a linked CONSUMER span per job, nested client spans."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from otel_support import install
from peers.seppy import seppy_driver

import sepp
from sepp.testing import SeppServer, sepp_server


@pytest.fixture
def otel() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    exporter, reader = install()
    reader.get_metrics_data()  # start from zero-ish: counters are cumulative, compare deltas
    yield exporter, reader
    exporter.clear()


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


async def run_until(worker: sepp.Worker, done: trio.Event, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await done.wait()
            worker.shutdown()


async def test_process_span_links_to_the_producer_and_parents_handler_ack_and_extend(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    exporter, _ = otel
    cfg = {"admin": {"enabled": False}, "limits": {"max_lease_duration_ms": 600}}
    tracer = trace.get_tracer("app")
    async with sepp_server(cfg) as server, sepp.open(server.address) as client:
        with tracer.start_as_current_span("http.request") as request:
            ack = await client.enqueue("traced", "slow")
        producer_trace = request.get_span_context().trace_id
        done = trio.Event()
        worker = sepp.Worker(client, ["traced"], lease_duration=0.6, auto_extend=True)

        @worker.handler("slow")
        async def slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            with tracer.start_as_current_span("handler.work"):
                await trio.sleep(1.0)  # outlives the 0.6 s lease: needs extends
            done.set()

        await run_until(worker, done)
    spans = exporter.get_finished_spans()
    (process,) = [s for s in spans if s.name == "sepp.process"]
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is None or process.parent.trace_id != producer_trace
    assert [link.context.trace_id for link in process.links] == [producer_trace]
    attrs = dict(process.attributes or {})
    assert attrs["sepp.job_id"] == ack.job_id and attrs["sepp.job_type"] == "slow"
    assert attrs["sepp.queue"] == "traced" and attrs["sepp.attempt"] == 1
    assert attrs["sepp.worker_id"] == worker.worker_id and attrs["sepp.outcome"] == "ack"
    pid = process.context.span_id
    children = {s.name for s in spans if s.parent is not None and s.parent.span_id == pid}
    assert {"handler.work", "sepp.ack", "sepp.extend"} <= children
    assert process.status.status_code is not StatusCode.ERROR


async def test_failed_handlers_mark_their_span_and_count_in_metrics(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    exporter, reader = otel
    async with sepp_server({"admin": {"enabled": False}}) as server:
        async with sepp.open(server.address) as client:
            for job_type in ("ok", "ok", "boom", "perm"):
                await client.enqueue("m", job_type, max_attempts=5)
            settled = 0
            done = trio.Event()
            worker = sepp.Worker(client, ["m"], max_in_flight=4)

            def count() -> None:
                nonlocal settled
                settled += 1
                if settled == 4:
                    done.set()

            @worker.handler("ok")
            async def ok(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                count()

            @worker.handler("boom")
            async def boom(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                if ctx.attempt == 1:
                    count()
                    raise ValueError("kaput")

            @worker.handler("perm")
            async def perm(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                count()
                raise sepp.HandlerError.permanent("poison")

            await run_until(worker, done)
    spans = [s for s in exporter.get_finished_spans() if s.name == "sepp.process"]
    by_outcome = {dict(s.attributes or {})["sepp.outcome"]: s for s in spans}
    assert by_outcome["error"].status.status_code is StatusCode.ERROR
    assert "kaput" in (by_outcome["error"].status.description or "")
    assert by_outcome["permanent"].status.status_code is StatusCode.ERROR
    assert by_outcome["ack"].status.status_code is not StatusCode.ERROR
    points = metric_points(reader)
    processed = {
        p.attributes["sepp.job_type"]: p.value for p in points["sepp.worker.jobs.processed"]
    }
    assert processed.get("ok", 0) >= 2
    nacked = {
        (p.attributes["sepp.job_type"], p.attributes["sepp.outcome"]): p.value
        for p in points["sepp.worker.jobs.nacked"]
    }
    assert nacked[("boom", "error")] >= 1 and nacked[("perm", "permanent")] >= 1
    in_flight = sum(
        p.value for p in points["sepp.worker.jobs.in_flight"] if p.attributes["sepp.queue"] == "m"
    )
    assert in_flight == 0
    assert sum(p.value for p in points["sepp.worker.reserves.completed"]) >= 1
    durations = [
        p for p in points["sepp.worker.handler.duration"] if p.attributes["sepp.queue"] == "m"
    ]
    assert sum(p.count for p in durations) >= 4


async def test_reserve_failures_are_counted(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader], sepp_server: SeppServer
) -> None:
    _, reader = otel
    before = sum(p.value for p in metric_points(reader).get("sepp.worker.reserves.failed", []))
    async with sepp.open(sepp_server.address) as client:
        worker = sepp.Worker(client, ["x"], reserve_error_backoff=0.05, wait_timeout=1)
        await sepp_server.stop()
        with trio.move_on_after(1.0):
            await worker.run()
        await sepp_server.start()
    after = sum(p.value for p in metric_points(reader)["sepp.worker.reserves.failed"])
    assert after - before >= 2


async def test_sepp_py_producer_span_links_to_our_process_span(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader], sepp_server: SeppServer
) -> None:
    exporter, _ = otel
    async with sepp.open(sepp_server.address) as client, seppy_driver(sepp_server.address) as py:
        produced = await py.call("enqueue_in_span", queue="from-py", job_type="t", span_name="req")
        done = trio.Event()
        worker = sepp.Worker(client, ["from-py"])

        @worker.handler("t")
        async def handle(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            done.set()

        await run_until(worker, done)
    (process,) = [s for s in exporter.get_finished_spans() if s.name == "sepp.process"]
    assert [f"{link.context.trace_id:032x}" for link in process.links] == [produced["trace_id"]]
    assert f"{process.links[0].context.span_id:016x}" == produced["enqueue_span_id"]


async def test_a_follow_up_enqueued_with_ctx_client_carries_the_handlers_trace(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    exporter, _ = otel
    async with (
        sepp_server({"admin": {"enabled": False}}) as server,
        sepp.open(server.address) as client,
    ):
        await client.enqueue("traced", "first")
        done = trio.Event()
        worker = sepp.Worker(client, ["traced"])
        follow_up: list[sepp.TraceContext | None] = []

        @worker.handler("first")
        async def first(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            await ctx.client.enqueue("traced", "second")

        @worker.handler("second")
        async def second(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            follow_up.append(ctx.trace_context)
            done.set()

        await run_until(worker, done)
    spans = exporter.get_finished_spans()
    (process,) = [
        s for s in spans if s.name == "sepp.process" and s.attributes["sepp.job_type"] == "first"
    ]
    (traced,) = follow_up
    assert traced is not None
    # The follow-up's producer trace is the first job's processing trace.
    assert traced.traceparent.split("-")[1] == f"{process.context.trace_id:032x}"
