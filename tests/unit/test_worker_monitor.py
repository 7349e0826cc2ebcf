"""The probe/metrics HTTP responder (malformed, slow and oversized requests) and the
Prometheus text the WorkerMonitor exposes."""

from __future__ import annotations

import re

import pytest
import trio
import trio.testing

import sepp
from sepp._worker import http_responder as http
from sepp._worker.monitor import MAX_SERIES, WorkerMonitor, feed_of
from sepp.testing import job_context


async def exchange(request: bytes, monitor: WorkerMonitor | None = None) -> tuple[int, bytes]:
    """Send `request` to a responder over an in-memory stream; the status and body back."""
    responder = http.Responder((monitor or WorkerMonitor())._routes())
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(responder.handle, server)
        await client.send_all(request)
        answer = b""
        async for chunk in client:
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *headers = head.decode().split("\r\n")
    assert "Connection: close" in headers
    assert f"Content-Length: {len(body)}" in headers
    return int(status_line.split()[1]), body


async def test_probes_answer_by_the_workers_state() -> None:
    monitor = WorkerMonitor()
    feed = feed_of(monitor)  # what the Worker tells it
    assert await exchange(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", monitor) == (
        200,
        b"ok: starting\n",
    )
    assert (await exchange(b"GET /readyz HTTP/1.1\r\n\r\n", monitor))[0] == 503
    feed.reserving()
    assert await exchange(b"GET /readyz?verbose HTTP/1.0\r\n\r\n", monitor) == (
        200,
        b"ok: reserving\n",
    )
    feed.reserve_done(0.1, sepp.TransportError("UNAVAILABLE: gone"))
    status, body = await exchange(b"GET /readyz HTTP/1.1\r\n\r\n", monitor)
    assert status == 503 and b"reserve failing (1 in a row): TransportError" in body
    feed.reserve_done(0.1, None)
    feed.shutting_down()
    assert await exchange(b"GET /readyz HTTP/1.1\r\n\r\n", monitor) == (
        503,
        b"not ready: shutting down\n",
    )
    assert (await exchange(b"GET /healthz HTTP/1.1\r\n\r\n", monitor))[0] == 200
    feed.stopped()
    assert (await exchange(b"GET /healthz HTTP/1.1\r\n\r\n", monitor))[0] == 503


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\n\r\n", 405),
        (b"HEAD /healthz HTTP/1.1\r\n\r\n", 405),
        (b"GET /nope HTTP/1.1\r\n\r\n", 404),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET  /metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics SPDY/3\r\n\r\n", 400),
        (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),  # TLS on plain HTTP
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000, 431),  # no end in sight
    ],
)
async def test_malformed_requests_get_an_error_and_a_closed_connection(
    request_bytes: bytes, status: int
) -> None:
    assert (await exchange(request_bytes))[0] == status


async def test_a_client_closing_early_gets_400_not_a_crash() -> None:
    responder = http.Responder({})
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"GET /metr")
    await client.send_eof()
    await responder.handle(server)  # returns; never raises
    assert b"400 Bad Request" in await client.receive_some()


async def test_a_slow_client_is_cut_off_at_the_read_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    responder = http.Responder(WorkerMonitor()._routes())
    client, server = trio.testing.memory_stream_pair()
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(responder.handle, server)
        await client.send_all(b"GET /healthz HTTP/1.1\r\n")  # and never the blank line
        answer = await client.receive_some()
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert trio.current_time() - began == pytest.approx(http.READ_TIMEOUT_S)


async def test_connections_beyond_the_limit_are_closed_unanswered(
    mock_clock: trio.testing.MockClock,
) -> None:
    responder = http.Responder(WorkerMonitor()._routes())
    pairs = [trio.testing.memory_stream_pair() for _ in range(http.MAX_CONNECTIONS + 1)]
    async with trio.open_nursery() as nursery:
        for _, server in pairs:  # one at a time: the last is the one too many
            nursery.start_soon(responder.handle, server)
            await trio.testing.wait_all_tasks_blocked()
        # The extra one was closed at once; the others wait for their requests.
        assert await pairs[-1][0].receive_some() == b""
        for client, _ in pairs[:-1]:
            await client.send_all(b"GET /healthz HTTP/1.1\r\n\r\n")
    for client, _ in pairs[:-1]:
        assert (await client.receive_some()).startswith(b"HTTP/1.1 200 ")


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
