"""OpenTelemetry: client spans, trace metadata, job trace injection — against the real server."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from otel_support import install

import sepp
from sepp.testing import SeppServer

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter, _ = install()
    yield exporter
    exporter.clear()


def traceparent_of(span: object) -> str:
    ctx = span.get_span_context()  # type: ignore[attr-defined]
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


async def test_enqueue_span_is_a_client_child_and_stamps_the_job(
    client: sepp.Client, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as app:
        ack = await client.enqueue("ot", "send", payload=sepp.Payload.text("x"))
    (enqueue,) = [s for s in spans.get_finished_spans() if s.name == "sepp.enqueue"]
    assert enqueue.kind is SpanKind.CLIENT
    assert enqueue.parent is not None
    assert enqueue.parent.span_id == app.get_span_context().span_id
    attrs = dict(enqueue.attributes or {})
    assert attrs["sepp.batch_size"] == 1 and attrs["sepp.job_id"] == ack.job_id
    assert list(attrs["sepp.queues"]) == ["ot"]  # type: ignore[arg-type]
    assert list(attrs["sepp.job_types"]) == ["send"]  # type: ignore[arg-type]
    assert attrs["sepp.accepted"] == 1 and attrs["messaging.system"] == "sepp"
    jobs = await client.reserve("ot", wait_timeout=1)
    assert jobs is not None
    assert jobs[0].ctx.trace_context is not None
    assert jobs[0].ctx.trace_context.traceparent == traceparent_of(enqueue)


async def test_explicit_trace_context_is_kept(
    client: sepp.Client, spans: InMemorySpanExporter
) -> None:
    mine = sepp.TraceContext("00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "k=v")
    with trace.get_tracer("test").start_as_current_span("request"):
        explicit = await client.enqueue("ot2", "t", trace_context=mine)
        implicit = await client.enqueue("ot2", "t")
    jobs = await client.reserve("ot2", max_jobs=2, wait_timeout=1)
    assert jobs is not None
    # Jobs enqueued within the same millisecond may come back in either order.
    by_id = {job.id: job.ctx.trace_context for job in jobs}
    assert by_id[explicit.job_id] == mine
    assert by_id[implicit.job_id] is not None and by_id[implicit.job_id] != mine


async def test_every_call_gets_one_span_with_error_status_on_failure(
    client: sepp.Client, spans: InMemorySpanExporter
) -> None:
    await client.get_server_info()
    await client.enqueue_atomic([sepp.EnqueueRequest("ot3", "t")])
    jobs = await client.reserve("ot3", wait_timeout=1, worker_id="w-1")
    assert jobs is not None
    ctx = jobs[0].ctx
    await client.extend(ctx, 10)
    assert await client.nack(ctx, reason="again") is False
    again = await client.reserve("ot3", wait_timeout=1)
    assert again is not None
    await client.ack(again[0].ctx)
    with pytest.raises(sepp.JobNotFoundError):
        await client.ack(again[0].ctx)
    await client.drain_dead_letters("ot3", max=5)
    names = [s.name for s in spans.get_finished_spans()]
    assert names == [
        "sepp.get_server_info",
        "sepp.enqueue_atomic",
        "sepp.reserve",
        "sepp.extend",
        "sepp.nack",
        "sepp.reserve",
        "sepp.ack",
        "sepp.ack",
        "sepp.drain_dead_letters",
    ]
    by_name = spans.get_finished_spans()
    assert all(s.kind is SpanKind.CLIENT for s in by_name)
    failed = by_name[7]
    assert failed.status.status_code is StatusCode.ERROR
    assert by_name[6].status.status_code is not StatusCode.ERROR
    reserve_attrs = dict(by_name[2].attributes or {})
    assert reserve_attrs["sepp.worker_id"] == "w-1" and reserve_attrs["sepp.jobs"] == 1
    ack_attrs = dict(by_name[6].attributes or {})
    assert ack_attrs["sepp.job_id"] == ctx.id and ack_attrs["sepp.attempt"] == 2


async def test_works_without_opentelemetry_installed(sepp_server: SeppServer) -> None:
    script = r"""
import sys
sys.modules["opentelemetry"] = None  # makes `import opentelemetry...` fail
import trio, sepp, sepp._client.otel
assert sepp._client.otel.AVAILABLE is False

async def main(address):
    async with sepp.open(address) as client:
        await client.enqueue("no-otel", "t", payload=sepp.Payload.json([1]))
        jobs = await client.reserve("no-otel", wait_timeout=2)
        assert jobs and jobs[0].ctx.trace_context is None
        await client.ack(jobs[0].ctx)
        print("round trip ok")

trio.run(main, sys.argv[1])
"""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    with trio.fail_after(60):
        out = await trio.run_process(
            [sys.executable, "-c", script, sepp_server.address],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
        )
    assert out.stdout.decode().strip() == "round trip ok", out.stderr.decode()
