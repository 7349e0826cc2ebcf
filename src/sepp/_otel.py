"""Optional OpenTelemetry glue. opentelemetry-api is imported on first use (the first span,
metric or `AVAILABLE` lookup, never by `import sepp`) and, when absent, everything here is a
shared no-op object: no allocation, no context lookups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._types import TraceContext
from ._version import __version__

if TYPE_CHECKING:
    from ._types import Job

# Bound by _load(): the first read of `_otel.AVAILABLE` goes through __getattr__ below.
AVAILABLE: bool
_loaded = False
_metrics: Any = None
_propagate: Any = None
_trace: Any = None


def _load() -> bool:
    """Import opentelemetry-api (the `otel` extra) if it is installed; once."""
    global AVAILABLE, _loaded, _metrics, _propagate, _trace
    try:
        from opentelemetry import metrics, propagate, trace
    except ImportError:  # pragma: no cover - exercised by a subprocess test
        AVAILABLE = False
    else:
        _metrics, _propagate, _trace = metrics, propagate, trace
        AVAILABLE = True
    _loaded = True
    return AVAILABLE


def _available() -> bool:
    return AVAILABLE if _loaded else _load()


if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        if name == "AVAILABLE":
            return _load()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


Header = tuple[bytes, bytes]
Attributes = Mapping[str, str | int | float | bool | Sequence[str]]
_INSTRUMENTATION = "sepp-trio"


class NoopSpan:
    """Stands in for a span when tracing is unavailable."""

    __slots__ = ()
    trace_context: TraceContext | None = None

    def __enter__(self) -> NoopSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, key: str, value: str | int | float | bool | Sequence[str]) -> None:
        pass

    def fail(self, description: str) -> None:
        pass


NOOP_SPAN = NoopSpan()


class OtelSpan:
    """A CLIENT or CONSUMER span, current while entered; exceptions mark it as an error."""

    __slots__ = ("_attributes", "_cm", "_kind", "_links", "_name", "_span")

    def __init__(self, name: str, kind: Any, attributes: Attributes, links: Any = None) -> None:
        self._name = name
        self._kind = kind
        self._attributes = dict(attributes)
        self._links = links
        self._cm: Any = None
        self._span: Any = None

    def __enter__(self) -> OtelSpan:
        tracer = _trace.get_tracer(_INSTRUMENTATION, __version__)
        self._cm = tracer.start_as_current_span(
            self._name, kind=self._kind, attributes=self._attributes, links=self._links
        )
        self._span = self._cm.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cm.__exit__(exc_type, exc, tb)

    @property
    def trace_context(self) -> TraceContext | None:
        """This span's W3C context, to stamp on enqueued jobs."""
        return current_trace_context()

    def set(self, key: str, value: str | int | float | bool | Sequence[str]) -> None:
        self._span.set_attribute(key, value)

    def fail(self, description: str) -> None:
        self._span.set_status(_trace.Status(_trace.StatusCode.ERROR, description))


def client_span(name: str, attributes: Attributes) -> NoopSpan | OtelSpan:
    if not _available():
        return NOOP_SPAN
    return OtelSpan(name, _trace.SpanKind.CLIENT, {"messaging.system": "sepp", **attributes})


def process_span(job: Job, worker_id: str | None) -> NoopSpan | OtelSpan:
    """The worker's CONSUMER span for one job, linked (not parented) to the job's trace."""
    if not _available():
        return NOOP_SPAN
    ctx = job.ctx
    links = []
    if ctx.trace_context is not None:
        carrier = {"traceparent": ctx.trace_context.traceparent}
        if ctx.trace_context.tracestate:
            carrier["tracestate"] = ctx.trace_context.tracestate
        remote = _trace.get_current_span(_propagate.extract(carrier)).get_span_context()
        if remote.is_valid:
            links.append(_trace.Link(remote))
    attributes: dict[str, str | int] = {
        "messaging.system": "sepp",
        "sepp.job_id": ctx.id,
        "sepp.job_type": ctx.job_type,
        "sepp.queue": ctx.queue,
        "sepp.attempt": ctx.attempt,
    }
    if worker_id:
        attributes["sepp.worker_id"] = worker_id
    return OtelSpan("sepp.process", _trace.SpanKind.CONSUMER, attributes, links)


def outgoing_headers() -> list[Header]:
    """`traceparent`/`tracestate` for the current context, from the configured propagator."""
    if not _available():
        return []
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return [
        (name.encode("ascii"), value.encode("ascii", "replace"))
        for name, value in carrier.items()
        if name in ("traceparent", "tracestate") and value
    ]


def current_trace_context() -> TraceContext | None:
    if not _available():
        return None
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    parent = carrier.get("traceparent")
    if not parent:
        return None
    return TraceContext(parent, carrier.get("tracestate") or None)


class WorkerMetrics:
    """The worker's instruments; created lazily so a meter provider set later is honoured."""

    def __init__(self) -> None:
        # False without the otel extra: callers skip building attributes for a no-op.
        self.enabled = _available()
        self._ready = False
        self._instruments: dict[str, Any] = {}

    def _get(self, name: str) -> Any:
        if not _available():
            return None
        if not self._ready:
            meter = _metrics.get_meter(_INSTRUMENTATION, __version__)
            self._instruments = {
                "processed": meter.create_counter(
                    "sepp.worker.jobs.processed", unit="{job}", description="Jobs acked"
                ),
                "nacked": meter.create_counter(
                    "sepp.worker.jobs.nacked", unit="{job}", description="Jobs nacked, by outcome"
                ),
                "in_flight": meter.create_up_down_counter(
                    "sepp.worker.jobs.in_flight", unit="{job}", description="Handlers running"
                ),
                "reserve_completed": meter.create_counter(
                    "sepp.worker.reserves.completed", unit="{call}", description="Reserve calls"
                ),
                "reserve_failed": meter.create_counter(
                    "sepp.worker.reserves.failed", unit="{call}", description="Failed reserves"
                ),
                "duration": meter.create_histogram(
                    "sepp.worker.handler.duration", unit="s", description="Handler run time"
                ),
            }
            self._ready = True
        return self._instruments[name]

    def add(self, name: str, amount: int, attributes: Attributes) -> None:
        instrument = self._get(name)
        if instrument is not None:
            instrument.add(amount, attributes)

    def record(self, name: str, value: float, attributes: Attributes) -> None:
        instrument = self._get(name)
        if instrument is not None:
            instrument.record(value, attributes)


_transparent_retries: Any = None


def count_transparent_retry(method: str, kind: object) -> None:
    """Count one call the server never processed that the transport sent again (a rare
    path: without the otel extra this is one flag check)."""
    global _transparent_retries
    if not _available():
        return
    if _transparent_retries is None:
        meter = _metrics.get_meter(_INSTRUMENTATION, __version__)
        _transparent_retries = meter.create_counter(
            "sepp.client.transparent_retries",
            unit="{call}",
            description="Calls the server never processed, sent again by the transport",
        )
    _transparent_retries.add(1, {"rpc.method": method, "sepp.reason": str(kind)})
