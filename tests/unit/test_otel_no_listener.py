"""With opentelemetry-api installed and no provider set (the API's proxy), sepp-trio starts no
span and injects no header; a provider set later is used from the next call on.

Each case runs in a fresh interpreter: a process can set its global providers only once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PRELUDE = """
import trio
import opentelemetry.propagate
from opentelemetry import trace
from opentelemetry.trace import NoOpTracer, ProxyTracer

import sepp
from sepp.testing import job_context
from tests.fixtures.scripted_channel import ScriptedChannel, connected

counts = {"span": 0, "inject": 0}


def counting(name, original):
    def wrapper(*args, **kwargs):
        counts[name] += 1
        return original(*args, **kwargs)
    return wrapper


# Every way a span or a header could be made: counted.
for cls in (ProxyTracer, NoOpTracer):
    cls.start_as_current_span = counting("span", cls.start_as_current_span)
    cls.start_span = counting("span", cls.start_span)
trace.ProxyTracerProvider.get_tracer = counting("span", trace.ProxyTracerProvider.get_tracer)
opentelemetry.propagate.inject = counting("inject", opentelemetry.propagate.inject)


class Recording(ScriptedChannel):
    def __init__(self):
        super().__init__()
        self.metadata = []

    async def call(self, method, request, *, timeout, metadata=()):
        self.metadata.append(dict(metadata))
        if method in ("Ack", "Nack"):
            return b""
        return await super().call(method, request, timeout=timeout, metadata=metadata)
"""


def run(body: str) -> None:
    script = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_no_span_machinery_runs_while_the_provider_is_the_proxy() -> None:
    run(
        """
        async def main():
            channel = Recording()
            async with connected(channel) as client:
                for _ in range(3):
                    await client.enqueue("q", "t")
                await client.enqueue_batch([sepp.EnqueueRequest("q", "t")] * 2)
                await client.ack(job_context("t"))
            async with connected(Recording(), enqueue_batching=sepp.Batching()) as batched:
                await batched.enqueue("q", "t")
            assert counts == {"span": 0, "inject": 0}, counts
            assert all(b"traceparent" not in m for m in channel.metadata), channel.metadata

        trio.run(main)
        """
    )


def test_a_provider_set_later_starts_tracing_at_the_next_call() -> None:
    run(
        """
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        async def main():
            channel = Recording()
            async with connected(channel) as client:
                await client.enqueue("q", "t")
                assert counts["span"] == 0
                exporter = InMemorySpanExporter()
                provider = TracerProvider()
                provider.add_span_processor(SimpleSpanProcessor(exporter))
                trace.set_tracer_provider(provider)
                await client.enqueue("q", "t")
            names = [span.name for span in exporter.get_finished_spans()]
            assert names == ["sepp.enqueue"], names
            assert b"traceparent" in channel.metadata[-1], channel.metadata

        trio.run(main)
        """
    )


def test_a_callers_trace_passes_through_without_a_provider() -> None:
    run(
        """
        from opentelemetry import context
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        async def main():
            remote = SpanContext(
                trace_id=0x1234, span_id=0x5678, is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            channel = Recording()
            async with connected(channel) as client:
                token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
                try:
                    await client.enqueue("q", "t")
                finally:
                    context.detach(token)
            header = channel.metadata[-1][b"traceparent"].decode()
            assert header.split("-")[1] == f"{0x1234:032x}", header

        trio.run(main)
        """
    )
