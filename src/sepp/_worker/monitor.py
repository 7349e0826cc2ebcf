"""WorkerMonitor: a Worker's health and its Prometheus metrics, kept in plain counters (no
OpenTelemetry SDK needed) and served over HTTP from a thread of its own (`_probes.server`,
written in the exposition format by `_probes.prometheus`), so a handler holding the event loop
delays no answer. The loop publishes (its events, its heartbeat) under the feed's lock; the
serving thread reads under it."""

from __future__ import annotations

import bisect
import enum
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from .._model import validate as v
from .._model.errors import ValidationError
from .._probes import prometheus
from .._probes.http1 import TEXT, Response, Route
from .._probes.server import ProbeServer
from .._runtime.concurrency import (
    TASK_STATUS_IGNORED,
    ServiceRuntime,
    TaskStatus,
    current,
)

if TYPE_CHECKING:
    from .._model.types import JobContext
    from .events import LimitCounts

# Seconds; the upper bounds of the duration histograms' buckets (+Inf is implied).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RESERVE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60)
# Distinct (queue, job type) label pairs kept; later ones are counted as job type "other".
MAX_SERIES = 200
OTHER = "other"  # the job type label of types without their own handler, and of overflow
# How often serve()'s heartbeat task stamps the loop as running: the lag is how late it is.
HEARTBEAT_S = 0.1
# The default bound on that lag past which /healthz fails: a loop held this long cannot extend
# leases of the default 30 s, so its jobs are being redelivered elsewhere anyway.
DEFAULT_MAX_LOOP_LAG_S = 30.0


class _State(enum.Enum):
    STARTING = "starting"
    WAITING = "waiting for the server"
    RESERVING = "reserving"
    PAUSED = "paused"
    SHUTTING_DOWN = "shutting down"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class Health:
    """What the probes say, as data: whether the worker is live and ready, what it is doing
    (or why it is not live), and its loop's lag in seconds (None: not measured)."""

    live: bool
    ready: bool
    status: str
    loop_lag: float | None


class _Histogram:
    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def copy(self) -> _Histogram:
        other = _Histogram(self.bounds)
        other.counts, other.total, other.count = list(self.counts), self.total, self.count
        return other

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1


class _Series:
    """Everything counted for one (queue, job type)."""

    __slots__ = (
        "dead_lettered",
        "deferred",
        "duration",
        "failed",
        "lease_lost",
        "retried",
        "started",
        "succeeded",
    )

    def __init__(self) -> None:
        self.started = self.succeeded = self.failed = 0
        self.retried = self.dead_lettered = self.lease_lost = self.deferred = 0
        self.duration = _Histogram(DURATION_BUCKETS)

    def copy(self) -> _Series:
        other = _Series()
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        other.duration = self.duration.copy()
        return other


_JOB_COUNTERS = (
    ("started", "Jobs whose handler started"),
    ("succeeded", "Jobs whose handler returned (acked)"),
    ("failed", "Jobs whose handler raised or timed out"),
    ("retried", "Failed jobs nacked for another attempt"),
    ("dead_lettered", "Jobs the server dead-lettered on our nack"),
    ("lease_lost", "Jobs whose lease was lost while their handler ran"),
    ("deferred", "Jobs a limit gave back for later, without costing them an attempt"),
)
# Per limit (labels "limit" and "scope"): (family suffix, type, help, the LimitCounts field).
_LIMIT_FAMILIES = (
    ("running", "gauge", "Handlers admitted by the limit and running now", "running"),
    ("waiting", "gauge", "Held jobs waiting for the limit now", "waiting"),
    ("admitted_total", "counter", "Jobs the limit admitted", "admitted"),
    ("deferred_total", "counter", "Jobs the limit deferred (no attempt spent)", "deferred"),
    ("lost_total", "counter", "Global permits lost while held (the handler was cancelled)", "lost"),
    ("wait_seconds_total", "counter", "Seconds the admitted jobs waited, summed", "waited_s"),
    ("keys", "gauge", "Keys the limit keeps state for in this process", "keys"),
)


class WorkerMonitor:
    """A Worker's health and metrics: pass it as `Worker(..., monitor=...)`, then serve them
    over HTTP with `serve()` (what `sepp-trio worker --health-port/--metrics-port` does) or
    read `live`, `ready`, `status` and `prometheus_text()` yourself.

    The answers come from threads of their own, whatever the handlers do to the event loop.
    `/healthz` answers 200 while the worker has not stopped and its event loop has not gone
    more than `max_loop_lag` seconds without running (None: no bound; measured while `serve()`
    runs, by a heartbeat task on the loop); the body gives the lag. `/readyz` answers 200 while
    it is also connected and reserving, not paused and not shutting down, else 503 with the
    reason ("paused", ...);
    `/metrics` is the Prometheus text format. Metrics are labelled by queue and job type; types
    without their own handler are counted as job type "other", and so are pairs beyond the
    first 200, so a queue full of odd job types cannot grow the output without bound."""

    def __init__(self, *, max_loop_lag: float | timedelta | None = DEFAULT_MAX_LOOP_LAG_S) -> None:
        self._max_loop_lag_s = (
            None if max_loop_lag is None else v.seconds("max_loop_lag", max_loop_lag)
        )
        self._feed = MonitorFeed()

    def __repr__(self) -> str:
        return f"<sepp.WorkerMonitor {self.status}>"

    # -- what it says --------------------------------------------------------------------------

    @property
    def live(self) -> bool:
        """Whether the worker has not stopped (True before it starts) and its event loop ran
        within `max_loop_lag` seconds."""
        return self._health().live

    @property
    def ready(self) -> bool:
        """Whether the worker is live and reserving, its last reserve worked, and it is not
        paused nor shutting down."""
        return self._health().ready

    @property
    def status(self) -> str:
        """One line saying what the worker is doing, and why it is not ready if it is not."""
        with self._feed.lock:
            return self._status()

    @property
    def loop_lag(self) -> float | None:
        """Seconds the event loop has gone without running (0.0 while it runs: `serve()`'s
        heartbeat stamps it ten times a second); None while nothing serves."""
        with self._feed.lock:
            return self._feed.loop_lag(time.monotonic())

    def _status(self) -> str:  # under the feed's lock
        feed = self._feed
        if feed.state is _State.RESERVING and feed.reserve_failures:
            return f"reserve failing ({feed.reserve_failures} in a row): {feed.last_reserve_error}"
        return feed.state.value

    def _health(self) -> Health:
        """What the probes say, read at once: live unless stopped or the loop is held past
        the bound (then the status says so), ready while also reserving without failures."""
        feed = self._feed
        with feed.lock:
            status = self._status()
            lag = feed.loop_lag(time.monotonic())
            live = feed.state is not _State.STOPPED
            reserving = feed.state is _State.RESERVING and not feed.reserve_failures
        bound = self._max_loop_lag_s
        if lag is not None and bound is not None and lag > bound:
            live = False
            status = (
                f"the event loop has not run for {lag:.3f}s, over max_loop_lag {bound:g}s"
                f" (a handler holds it?); {status}"
            )
        return Health(live, live and reserving, status, lag)

    def prometheus_text(self) -> str:
        """The metrics in the Prometheus text exposition format (version 0.0.4)."""
        feed = self._feed
        ready = self.ready
        with feed.lock:  # a copy, written outside the lock the loop's events take
            lag = feed.loop_lag(time.monotonic())
            series = sorted((key, s.copy()) for key, s in feed.series.items())
            unknown_type = sorted(feed.unknown_type.items())
            in_flight, reserves_ok, reserves_failed = (
                feed.in_flight,
                feed.reserves_ok,
                feed.reserves_failed,
            )
            reserve_duration = feed.reserve_duration.copy()
            limits = sorted(feed.limits.values())
            paused = feed.state is _State.PAUSED
        Family = prometheus.Family
        families: list[prometheus.Family] = []
        for name, help_text in _JOB_COUNTERS:
            counter = Family(f"sepp_worker_jobs_{name}_total", "counter", f"{help_text}.")
            for (queue, job_type), s in series:
                counter.add(getattr(s, name), queue=queue, job_type=job_type)
            families.append(counter)
        unknown = Family(
            "sepp_worker_jobs_unknown_type_total",
            "counter",
            "Jobs of a type without a handler, given back.",
        )
        for queue, n in unknown_type:
            unknown.add(n, queue=queue)
        duration = Family(
            "sepp_worker_job_duration_seconds",
            "histogram",
            "Handler run time (with its middleware).",
        )
        for (queue, job_type), s in series:
            _add_histogram(duration, s.duration, queue=queue, job_type=job_type)
        in_flight_gauge = Family("sepp_worker_jobs_in_flight", "gauge", "Handlers running now.")
        in_flight_gauge.add(in_flight)
        reserves = Family("sepp_worker_reserves_total", "counter", "Reserve calls, by result.")
        reserves.add(reserves_ok, result="ok")
        reserves.add(reserves_failed, result="error")
        reserve_time = Family(
            "sepp_worker_reserve_duration_seconds",
            "histogram",
            "Reserve call time (a long poll waits up to its wait_timeout).",
        )
        _add_histogram(reserve_time, reserve_duration)
        ready_gauge = Family(
            "sepp_worker_ready",
            "gauge",
            "1 while the worker is connected, reserving and not shutting down.",
        )
        ready_gauge.add(int(ready))
        paused_gauge = Family(
            "sepp_worker_paused",
            "gauge",
            "1 while the worker is paused: it reserves nothing, and what it holds runs.",
        )
        paused_gauge.add(int(paused))
        lag_gauge = Family(
            "sepp_worker_event_loop_lag_seconds",
            "gauge",
            "How long the event loop has gone without running (0 while it runs).",
        )
        if lag is not None:
            lag_gauge.add(lag)
        families += [unknown, duration, in_flight_gauge, reserves, reserve_time]
        families += [ready_gauge, paused_gauge, lag_gauge]
        for suffix, kind, help_text, field in _LIMIT_FAMILIES:
            family = Family(f"sepp_worker_limit_{suffix}", kind, f"{help_text}.")
            for counts in limits:
                family.add(getattr(counts, field), limit=counts.label, scope=counts.scope)
            families.append(family)
        return prometheus.write(families)

    # -- serving --------------------------------------------------------------------------------

    def _routes(self, *, health: bool = True, metrics: bool = True) -> dict[str, Route]:
        routes: dict[str, Route] = {}
        if health:
            routes["/healthz"] = lambda: _probe(self._health(), ready=False)
            routes["/readyz"] = lambda: _probe(self._health(), ready=True)
        if metrics:
            routes["/metrics"] = lambda: (
                200,
                prometheus.CONTENT_TYPE,
                self.prometheus_text().encode(),
            )
        return routes

    async def serve(
        self,
        port: int,
        *,
        host: str | None = None,
        health: bool = True,
        metrics: bool = True,
        task_status: TaskStatus[int] = TASK_STATUS_IGNORED,
    ) -> None:
        """Serve `/healthz` and `/readyz` (with `health`) and `/metrics` (with `metrics`) over
        HTTP on `host:port` (None: every interface; port 0: any free one) until cancelled.
        `await nursery.start(monitor.serve, port)` returns the bound port. The answers come
        from a thread of its own (stopped and joined when this returns), so a handler holding
        the event loop delays none; meanwhile this task is the heartbeat that measures the
        loop's lag. Each connection gets one GET answered and is closed; a request head over
        8 KiB, or not received within 5 seconds, gets an error instead."""
        if not (health or metrics):
            raise ValidationError("serve", "needs health, metrics or both")
        await serve_routes(
            self,
            self._routes(health=health, metrics=metrics),
            port,
            host=host,
            task_status=task_status,
        )


async def serve_routes(
    monitor: WorkerMonitor,
    routes: Mapping[str, Route],
    port: int,
    *,
    host: str | None,
    task_status: TaskStatus[int] = TASK_STATUS_IGNORED,
) -> None:
    """`monitor.serve()` with the routes given (the supervisor's child adds its own), until
    cancelled: the server's thread answers, this task is the heartbeat."""
    cc = current()
    feed = monitor._feed
    with ProbeServer(routes, port, host=host) as server:
        feed.beat(first=True)  # measured from now, before anything else runs
        try:
            task_status.started(server.port)
            await feed.heartbeat(cc)
        finally:
            feed.last_beat()


def health_of(monitor: WorkerMonitor) -> Health:
    """What `monitor`'s probes say, as data (what a child tells the supervisor)."""
    return monitor._health()


def routes_of(monitor: WorkerMonitor, *, health: bool, metrics: bool) -> dict[str, Route]:
    """`monitor`'s routes: `/healthz` and `/readyz` with `health`, `/metrics` with `metrics`."""
    return monitor._routes(health=health, metrics=metrics)


def feed_of(monitor: WorkerMonitor) -> MonitorFeed:
    """What feeds `monitor`: the Worker's events, and the command line's `waiting_for_server`."""
    return monitor._feed


class MonitorFeed:
    """A WorkerMonitor's state and counters, kept from the `WorkerEvents` it is told on the
    event loop, and read by the threads that serve them: each side holds `lock` (uncontended
    but for the moment a probe copies the numbers)."""

    __slots__ = (
        "_beat_due",
        "_beating",
        "in_flight",
        "known_types",
        "last_reserve_error",
        "limits",
        "lock",
        "reserve_duration",
        "reserve_failures",
        "reserves_failed",
        "reserves_ok",
        "series",
        "state",
        "unknown_type",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._beating = 0  # heartbeat tasks running (one per serve())
        self._beat_due: float | None = None  # time.monotonic() by which the loop beats again
        self.state = _State.STARTING
        self.reserve_failures = 0  # in a row
        self.last_reserve_error = ""
        self.known_types: frozenset[str] | None = None  # None: every type is "known"
        self.series: dict[tuple[str, str], _Series] = {}
        self.in_flight = 0
        self.reserves_ok = 0
        self.reserves_failed = 0
        self.reserve_duration = _Histogram(RESERVE_BUCKETS)
        self.unknown_type: dict[str, int] = {}
        self.limits: dict[tuple[str, str], LimitCounts] = {}

    def worker_started(self, job_types: Iterable[str] | None) -> None:
        """The job types with a handler of their own (None: label every type as it is)."""
        with self.lock:
            self.known_types = None if job_types is None else frozenset(job_types)

    def waiting_for_server(self) -> None:
        with self.lock:
            self.state = _State.WAITING

    def reserving(self) -> None:
        with self.lock:
            if self.state in (_State.STARTING, _State.WAITING):
                self.state = _State.RESERVING

    def paused(self) -> None:
        with self.lock:
            if self.state is _State.RESERVING:
                self.state = _State.PAUSED

    def resumed(self) -> None:
        with self.lock:
            if self.state is _State.PAUSED:
                self.state = _State.RESERVING

    def shutting_down(self) -> None:
        with self.lock:
            if self.state is not _State.STOPPED:
                self.state = _State.SHUTTING_DOWN

    def stopped(self) -> None:
        with self.lock:
            self.state = _State.STOPPED

    def reserve_done(self, duration_s: float, error: BaseException | None) -> None:
        with self.lock:
            self.reserve_duration.observe(duration_s)
            if error is None:
                self.reserves_ok += 1
                self.reserve_failures = 0
            else:
                self.reserves_failed += 1
                self.reserve_failures += 1
                self.last_reserve_error = f"{type(error).__name__}: {error}"[:300]

    def job_started(self, ctx: JobContext) -> None:
        with self.lock:
            self.in_flight += 1
            self._series_for(ctx).started += 1

    def job_ended(self, ctx: JobContext, duration_s: float) -> None:
        with self.lock:
            self.in_flight -= 1
            self._series_for(ctx).duration.observe(duration_s)

    def job_settled(self, ctx: JobContext, label: str | None, dead_lettered: bool | None) -> None:
        with self.lock:
            if label == "unknown_type":
                self.unknown_type[ctx.queue] = self.unknown_type.get(ctx.queue, 0) + 1
                return
            series = self._series_for(ctx)
            if label is None:
                series.lease_lost += 1
            elif label == "ack":
                series.succeeded += 1
            elif label == "deferred":
                series.deferred += 1
            elif label != "shutdown":
                series.failed += 1
                if dead_lettered:
                    series.dead_lettered += 1
                elif dead_lettered is not None:
                    series.retried += 1

    def limit_changed(self, counts: LimitCounts) -> None:
        with self.lock:
            self.limits[(counts.label, counts.scope)] = counts

    def loop_lag(self, now: float) -> float | None:
        """How late the heartbeat is at `now` (None: no heartbeat runs). Under `lock`."""
        return None if self._beat_due is None else max(0.0, now - self._beat_due)

    def beat(self, *, first: bool = False) -> None:
        """Stamp the loop as running (the `first` beat of a heartbeat, before it starts)."""
        due = time.monotonic() + HEARTBEAT_S
        with self.lock:
            self._beating += first
            self._beat_due = max(due, self._beat_due or 0.0)

    async def heartbeat(self, cc: ServiceRuntime) -> None:
        """After the `first` beat: stamp the loop as running every `HEARTBEAT_S` seconds,
        until cancelled (then `last_beat()`)."""
        while True:
            await cc.sleep(HEARTBEAT_S)
            self.beat()

    def last_beat(self) -> None:
        """A heartbeat ended; with the last one, the lag is no longer measured."""
        with self.lock:
            self._beating -= 1
            if not self._beating:
                self._beat_due = None

    def _series_for(self, ctx: JobContext) -> _Series:  # under `lock`
        job_type = ctx.job_type
        if self.known_types is not None and job_type not in self.known_types:
            job_type = OTHER
        key = (ctx.queue, job_type)
        series = self.series.get(key)
        if series is None:
            if len(self.series) >= MAX_SERIES:
                key = (ctx.queue, OTHER)
                series = self.series.get(key)
            if series is None:
                series = self.series[key] = _Series()
        return series


def _probe(health: Health, *, ready: bool) -> Response:
    """A probe's answer: 200 or 503, the status on the first line, the lag on the second."""
    ok = health.ready if ready else health.live
    body = f"{'ok' if ok else 'not ready'}: {health.status}\n"
    if health.loop_lag is not None:
        body += f"event loop lag: {health.loop_lag:.3f}s\n"
    return (200 if ok else 503), TEXT, body.encode()


def _add_histogram(family: prometheus.Family, histogram: _Histogram, **labels: str) -> None:
    family.add_histogram(
        histogram.bounds, histogram.counts, histogram.total, histogram.count, **labels
    )
