"""The WorkerMonitor's probes by the worker's state, its HTTP serving, and the Prometheus text
it exposes (the server itself: tests/unit/test_probe_server.py)."""

from __future__ import annotations

import re

import pytest
import trio

import sepp
from sepp._worker.monitor import MAX_SERIES, Health, WorkerMonitor, feed_of, health_of
from sepp.testing import job_context


def probe(monitor: WorkerMonitor, path: str) -> tuple[int, bytes]:
    """What `path` answers (the route the server calls): the status and body."""
    status, content_type, body = monitor._routes()[path]()
    assert content_type == "text/plain; charset=utf-8"
    return status, body


def test_probes_answer_by_the_workers_state() -> None:
    monitor = WorkerMonitor()
    feed = feed_of(monitor)  # what the Worker tells it
    assert probe(monitor, "/healthz") == (200, b"ok: starting\n")
    assert probe(monitor, "/readyz") == (503, b"not ready: starting\n")
    feed.reserving()
    assert probe(monitor, "/readyz") == (200, b"ok: reserving\n")
    feed.reserve_done(0.1, sepp.TransportError("UNAVAILABLE: gone"))
    status, body = probe(monitor, "/readyz")
    assert status == 503 and b"reserve failing (1 in a row): TransportError" in body
    feed.reserve_done(0.1, None)
    feed.shutting_down()
    assert probe(monitor, "/readyz") == (503, b"not ready: shutting down\n")
    assert probe(monitor, "/healthz")[0] == 200
    feed.stopped()
    assert probe(monitor, "/healthz")[0] == 503


def test_the_probes_say_the_loops_lag_and_fail_past_the_bound_as_data_too() -> None:
    monitor = WorkerMonitor(max_loop_lag=1.0)
    feed = feed_of(monitor)
    feed.reserving()
    assert health_of(monitor) == Health(True, True, "reserving", None)
    feed.beat(first=True)  # a heartbeat runs: the lag is measured
    health = health_of(monitor)
    assert (health.live, health.ready, health.status) == (True, True, "reserving")
    assert health.loop_lag == 0.0
    assert probe(monitor, "/healthz") == (200, b"ok: reserving\nevent loop lag: 0.000s\n")
    with feed.lock:
        feed._beat_due = 0.0  # the loop last beat long ago
    health = health_of(monitor)
    assert not health.live and not health.ready and health.loop_lag is not None
    assert health.status == (
        f"the event loop has not run for {health.loop_lag:.3f}s, over max_loop_lag 1s (a"
        " handler holds it?); reserving"
    )
    status, body = probe(monitor, "/readyz")
    assert status == 503
    assert body.startswith(b"not ready: the event loop has not run for ")
    assert body.decode().splitlines()[1].startswith("event loop lag: ")
    feed.last_beat()
    assert health_of(monitor).loop_lag is None


async def test_serve_listens_and_answers_over_tcp() -> None:
    monitor = WorkerMonitor()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: monitor.serve(
                0, host="127.0.0.1", health=False, task_status=task_status
            )
        )
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /metrics HTTP/1.1\r\n\r\n")
        answer = b""
        async for chunk in stream:
            answer += chunk
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert (await stream.receive_some()).startswith(b"HTTP/1.1 404 ")  # health=False
        nursery.cancel_scope.cancel()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Type: text/plain; version=0.0.4" in answer
    assert b"\nsepp_worker_ready 0\n" in answer


# -- the exposition format ------------------------------------------------------------------

LINE = re.compile(
    r'^(# (HELP|TYPE) \w+ .+|\w+(\{(\w+="([^"\\\n]|\\.)*",?)*\})? '
    r"(\d+(\.\d+)?(e[-+]?\d+)?|\+Inf))$"
)


def fed_monitor() -> WorkerMonitor:
    monitor = WorkerMonitor()
    feed = feed_of(monitor)  # what the Worker tells it
    feed.worker_started(["send", 'we"ird\\type\n'])
    feed.reserving()
    for attempt, (label, dead) in enumerate(
        [("ack", None), ("error", False), ("error", True), ("timeout", False), (None, None)], 1
    ):
        ctx = job_context("send", queue="emails", attempt=attempt)
        feed.job_started(ctx)
        feed.job_ended(ctx, 0.02 * attempt)
        feed.job_settled(ctx, label, dead)
    odd = job_context('we"ird\\type\n', queue="emails")
    feed.job_started(odd)
    feed.job_ended(odd, 3.0)
    feed.job_settled(odd, "ack", None)
    feed.job_settled(job_context("unregistered", queue="emails"), "unknown_type", None)
    catch_all = job_context("handled-by-catch-all", queue="emails")
    feed.job_started(catch_all)
    feed.reserve_done(0.5, None)
    feed.reserve_done(30.0, sepp.TransportError("x"))
    return monitor


def test_the_metrics_are_valid_prometheus_text_with_the_counts() -> None:
    text = fed_monitor().prometheus_text()
    assert text.endswith("\n")
    bad = [line for line in text.splitlines() if not LINE.match(line)]
    assert bad == []
    lines = set(text.splitlines())
    s = '{queue="emails",job_type="send"}'
    for line in [
        f"sepp_worker_jobs_started_total{s} 5",
        f"sepp_worker_jobs_succeeded_total{s} 1",
        f"sepp_worker_jobs_failed_total{s} 3",
        f"sepp_worker_jobs_retried_total{s} 2",
        f"sepp_worker_jobs_dead_lettered_total{s} 1",
        f"sepp_worker_jobs_lease_lost_total{s} 1",
        'sepp_worker_jobs_unknown_type_total{queue="emails"} 1',
        'sepp_worker_jobs_started_total{queue="emails",job_type="other"} 1',
        'sepp_worker_jobs_succeeded_total{queue="emails",job_type="we\\"ird\\\\type\\n"} 1',
        'sepp_worker_job_duration_seconds_bucket{queue="emails",job_type="send",le="0.025"} 1',
        'sepp_worker_job_duration_seconds_bucket{queue="emails",job_type="send",le="0.1"} 5',
        'sepp_worker_job_duration_seconds_bucket{queue="emails",job_type="send",le="+Inf"} 5',
        f"sepp_worker_job_duration_seconds_count{s} 5",
        "sepp_worker_jobs_in_flight 1",
        'sepp_worker_reserves_total{result="ok"} 1',
        'sepp_worker_reserves_total{result="error"} 1',
        'sepp_worker_reserve_duration_seconds_bucket{le="0.5"} 1',
        'sepp_worker_reserve_duration_seconds_bucket{le="30"} 2',
        "sepp_worker_reserve_duration_seconds_count 2",
        "sepp_worker_ready 0",  # the last reserve failed
        "# TYPE sepp_worker_job_duration_seconds histogram",
        "# TYPE sepp_worker_jobs_in_flight gauge",
    ]:
        assert line in lines, line
    total = next(
        line for line in lines if line.startswith(f"sepp_worker_job_duration_seconds_sum{s}")
    )
    assert float(total.split()[-1]) == pytest.approx(0.3)


def test_job_type_labels_stay_bounded() -> None:
    monitor = WorkerMonitor()
    feed = feed_of(monitor)  # what the Worker tells it
    feed.worker_started(None)  # every type labelled as it is, up to the cap
    for n in range(MAX_SERIES + 50):
        feed.job_started(job_context(f"type-{n}", queue="q"))
    text = monitor.prometheus_text()
    started = [line for line in text.splitlines() if line.startswith("sepp_worker_jobs_started")]
    assert len(started) == MAX_SERIES + 1  # the cap, and "other" for the rest
    assert 'sepp_worker_jobs_started_total{queue="q",job_type="other"} 50' in started
