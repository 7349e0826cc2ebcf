"""Trace metadata on every call, and one span per logical call however many retries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_support import install

import sepp
from sepp._client.client import Client
from sepp._pb import queue_pb2 as pb
from sepp._runtime.trio_runtime import TRIO
from sepp._util.log import Log
from sepp.wire._status import StatusCode
from sepp.wire.drivers._trio import RpcError


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter, _ = install()
    yield exporter
    exporter.clear()


class RecordingChannel:
    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.metadata: list[dict[bytes, bytes]] = []

    async def call(
        self, method: str, request: bytes, *, timeout: float | None, metadata: object = ()
    ) -> bytes:
        self.metadata.append(dict(metadata))  # type: ignore[call-overload]
        if self.failures:
            self.failures -= 1
            raise RpcError(StatusCode.UNAVAILABLE, "flaky")
        info = pb.GetServerInfoResponse(server_version="9.9")
        info.server_time.GetCurrentTime()
        return info.SerializeToString()


def make_client(channel: RecordingChannel, attempts: int = 1) -> Client:
    policy = sepp.RetryPolicy(max_attempts=attempts, initial_backoff=0.001)
    return Client(
        channel, address="x", rpc_timeout=1, retry_policy=policy, log=Log(None), runtime=TRIO
    )  # type: ignore[arg-type]


async def test_active_span_is_sent_as_traceparent_metadata(spans: InMemorySpanExporter) -> None:
    channel = RecordingChannel()
    client = make_client(channel)
    await client.get_server_info()  # no active app span: only our own CLIENT span
    with trace.get_tracer("t").start_as_current_span("app"):
        await client.get_server_info()
    finished = spans.get_finished_spans()
    ours = [s for s in finished if s.name == "sepp.get_server_info"]
    assert len(ours) == 2
    for sent, span in zip(channel.metadata, ours, strict=True):
        ctx = span.get_span_context()
        assert (
            sent[b"traceparent"]
            == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}".encode()
        )


async def test_retries_happen_inside_one_span(spans: InMemorySpanExporter) -> None:
    channel = RecordingChannel(failures=2)
    client = make_client(channel, attempts=3)
    info = await client.get_server_info()
    assert info.server_version == "9.9"
    assert len(channel.metadata) == 3
    assert [s.name for s in spans.get_finished_spans()] == ["sepp.get_server_info"]
    assert len({m[b"traceparent"] for m in channel.metadata}) == 1
