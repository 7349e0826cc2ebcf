"""One in-memory OpenTelemetry SDK setup per test process (providers can be set only once)."""

from __future__ import annotations

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_state: dict[str, object] = {}


def install() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    if not _state:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _state["exporter"], _state["reader"] = exporter, reader
    exporter = _state["exporter"]
    reader = _state["reader"]
    assert isinstance(exporter, InMemorySpanExporter)
    assert isinstance(reader, InMemoryMetricReader)
    exporter.clear()
    return exporter, reader
