"""Optional OpenTelemetry glue. opentelemetry-api is imported on first use (the first span,
metric or `AVAILABLE` lookup, never by `import sepp`) and, when absent, everything here is a
shared no-op object: no allocation, no context lookups.

Many applications have opentelemetry-api installed (through some other dependency) and never
set a provider: the API's proxy provider then makes every span a no-op, yet starting one costs
more than the rest of an enqueue. So `tracing()` first asks whether anyone listens (a tracer
provider was set, or the current context carries a span to propagate) and everything here
takes its no-op path when no one does; a provider set later is seen by the next call."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._model.types import TraceContext
from .._version import __version__

if TYPE_CHECKING:
    from .._model.types import Job

# Bound by _load(): the first read of `_otel.AVAILABLE` goes through __getattr__ below.
AVAILABLE: bool
_loaded = False
_metrics: Any = None
_propagate: Any = None
_trace: Any = None


# Bound by _load() when the API is installed: whether a tracer / meter provider is set.
_tracer_provider_set: Callable[[], bool]
_meter_provider_set: Callable[[], bool]
_current_span: Callable[[], object]
_no_span: object = None


def _load() -> bool:
    """Import opentelemetry-api (the `otel` extra) if it is installed; once."""
    global AVAILABLE, _loaded, _metrics, _propagate, _trace
    global _tracer_provider_set, _meter_provider_set, _current_span, _no_span
    try:
        from opentelemetry import metrics, propagate, trace
    except ImportError:  # pragma: no cover - exercised by a subprocess test
        AVAILABLE = False
    else:
        _metrics, _propagate, _trace = metrics, propagate, trace
        _tracer_provider_set, _meter_provider_set = _provider_checks(trace, metrics)
        _current_span, _no_span = trace.get_current_span, trace.INVALID_SPAN
        AVAILABLE = True
    _loaded = True
    return AVAILABLE


def _provider_checks(trace: Any, metrics: Any) -> tuple[Callable[[], bool], Callable[[], bool]]:
    """Two cheap "was a provider set?" tests. The public getters cost about 3 µs a call (each
    looks up an environment variable through a KeyError), so they are called once here (which
    loads a provider named by OTEL_PYTHON_*_PROVIDER) and then the API's globals are read; if
    a future API lacks them, the public getters are used."""
    from opentelemetry.metrics import _internal as metrics_internal

    trace.get_tracer_provider()
    metrics.get_meter_provider()
    no_tracing = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    no_metrics = (metrics.NoOpMeterProvider, getattr(metrics_internal, "_ProxyMeterProvider", ()))
    if hasattr(trace, "_TRACER_PROVIDER") and hasattr(metrics_internal, "_METER_PROVIDER"):

        def tracer_set() -> bool:
            provider = trace._TRACER_PROVIDER
            return provider is not None and not isinstance(provider, no_tracing)

        def meter_set() -> bool:
            provider = metrics_internal._METER_PROVIDER
            return provider is not None and not isinstance(provider, no_metrics)

        return tracer_set, meter_set
    return (  # pragma: no cover - an API without the globals
        lambda: not isinstance(trace.get_tracer_provider(), no_tracing),
        lambda: not isinstance(metrics.get_meter_provider(), no_metrics),
    )


def _available() -> bool:
    return AVAILABLE if _loaded else _load()


def tracing() -> bool:
    """Whether spans would be recorded or a trace context propagated: a tracer provider is
    set, or the current context carries a span (a caller's trace passes through us even
    without an SDK). False without the otel extra."""
    if not (AVAILABLE if _loaded else _load()):
        return False
    return _tracer_provider_set() or _current_span() is not _no_span


def metering() -> bool:
    """Whether a meter provider is set (False without the otel extra)."""
    return (AVAILABLE if _loaded else _load()) and _meter_provider_set()


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


def client_span(
    name: str, attributes: Attributes | Callable[[], Attributes]
) -> NoopSpan | OtelSpan:
    """A CLIENT span; `attributes` may be a function, called only when someone listens."""
    if not tracing():
        return NOOP_SPAN
    if callable(attributes):
        attributes = attributes()
    return OtelSpan(name, _trace.SpanKind.CLIENT, {"messaging.system": "sepp", **attributes})


def process_span(job: Job, worker_id: str | None) -> NoopSpan | OtelSpan:
    """The worker's CONSUMER span for one job, linked (not parented) to the job's trace."""
    if not tracing():
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
    if not tracing():
        return []
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return [
        (name.encode("ascii"), value.encode("ascii", "replace"))
        for name, value in carrier.items()
        if name in ("traceparent", "tracestate") and value
    ]


def current_trace_context() -> TraceContext | None:
    if not tracing():
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
        self._ready = False
        self._instruments: dict[str, Any] = {}

    @property
    def enabled(self) -> bool:
        """False without the otel extra or a meter provider: callers skip building attributes
        for a no-op. A provider set later is honoured from then on."""
        return metering()

    def _get(self, name: str) -> Any:
        if not metering():
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
