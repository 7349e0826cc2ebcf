"""Calls through real proxies in front of a real sepp server: not one of them fails.

nginx (`grpc_pass`, its defaults) ends every client connection with GOAWAY after
`keepalive_requests` calls and on every reload, and runs at most 128 calls at once on one
connection; HAProxy speaks HTTP/2 on both sides. The proxies run from the configs the docs
publish (docs/proxies/, see fixtures/proxies.py), and the client runs with its defaults (no
RetryPolicy): a call the proxy never passed on must go out again by itself.

Each test asserts 0 failed calls, then drains the queue from the server directly and checks
that every job is there exactly once (counted by payload). Half the jobs carry an
idempotency key, half none, so a call sent twice after the server had processed it would
show up as a second job (no key) or a deduplicated ack (key). Without nginx or HAProxy the
proxy tests fail, saying how to get them (scripts/ensure-proxies.sh).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio
from fixtures.fake_client import RecordingLogger
from fixtures.proxies import haproxy_proxy, nginx_proxy
from fixtures.proxy_load import (
    QUEUE,
    Load,
    arrival_problems,
    check_all_arrived,
    enqueue_through,
    jobs_on_server,
    payload_of,
)

import sepp
from sepp.testing import SeppServer

pytestmark = [pytest.mark.both_engines, pytest.mark.asyncio_too]

TEST_TIMEOUT_S = 120.0


def assert_each_once(seen: Counter[bytes], expected: set[bytes]) -> None:
    missing, extra, twice = arrival_problems(seen, expected)
    assert (missing, extra, twice) == (0, 0, 0), (
        f"{missing} missing, {extra} unexpected, {twice} more than once"
    )


# -- nginx ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keepalive_requests", "jobs"),
    [(1000, 2500), (100, 1000)],
    ids=["keepalive_requests=1000", "keepalive_requests=100"],
)
async def test_nginx_h2c_goaway_after_keepalive_requests_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path, keepalive_requests: int, jobs: int
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with nginx_proxy(
            sepp_server.address, tmp_path, keepalive_requests=keepalive_requests
        ) as proxy:
            load = await enqueue_through(proxy.h2c_address, jobs, tasks=64)
        await check_all_arrived(sepp_server.address, load)


async def test_nginx_tls_terminated_at_the_proxy_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with nginx_proxy(sepp_server.address, tmp_path, keepalive_requests=100) as proxy:
            load = await enqueue_through(proxy.tls_address, 1000, tasks=64, **proxy.tls_options())
        await check_all_arrived(sepp_server.address, load)


async def test_nginx_reload_three_times_under_load_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    load = Load()
    with trio.fail_after(TEST_TIMEOUT_S):
        async with nginx_proxy(sepp_server.address, tmp_path) as proxy:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(load.reload_at, proxy, (500, 1200, 1900))
                await enqueue_through(proxy.h2c_address, 2500, tasks=32, load=load)
            assert proxy.reloads == 3
        await check_all_arrived(sepp_server.address, load, reloaded=True)


async def test_keyed_jobs_with_a_retry_policy_survive_a_tls_reload_every_100_calls(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    # What the docs advise behind a proxy that reloads under load: every job keyed, and a
    # RetryPolicy. An answer a reload's reset threw away is then retried, and the server
    # deduplicates it: not one call fails, and every job is there once.
    load = Load()
    with trio.fail_after(TEST_TIMEOUT_S):
        async with nginx_proxy(sepp_server.address, tmp_path, keepalive_requests=100) as proxy:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(load.reload_at, proxy, range(100, 4000, 100))
                await enqueue_through(
                    proxy.tls_address,
                    4000,
                    tasks=64,
                    load=load,
                    all_keyed=True,
                    retry_policy=sepp.RetryPolicy(max_attempts=4, initial_backoff=0.05),
                    **proxy.tls_options(),
                )
        await check_all_arrived(sepp_server.address, load, retried=True)


async def test_nginx_more_concurrent_calls_than_its_stream_limit_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with nginx_proxy(sepp_server.address, tmp_path) as proxy:
            # 300 tasks on one connection against nginx's 128 streams, and one GOAWAY.
            load = await enqueue_through(proxy.h2c_address, 1500, tasks=300)
        await check_all_arrived(sepp_server.address, load)


async def test_long_poll_through_nginx_survives_goaway_and_is_woken_by_an_enqueue(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            nginx_proxy(sepp_server.address, tmp_path, keepalive_requests=100) as proxy,
            sepp.open(proxy.h2c_address) as client,
        ):
            reserved: list[sepp.Job] | None = None

            async def long_poll() -> None:
                nonlocal reserved
                reserved = await client.reserve(QUEUE, lease_duration=60, wait_timeout=25)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(long_poll)
                # Once it is in flight (its stream open): it parks on the server, no job yet.
                while not (conn := client._channel._current) or not conn.proto.active_calls:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                # 150 more calls on the same client: nginx ends the long-poll's connection
                # with GOAWAY after its 100th call, and the long-poll must live on.
                for _ in range(150):
                    await client.get_server_info()
                await client.enqueue(QUEUE, "wake", payload=sepp.Payload.bytes(b"wake"))
            assert reserved is not None
            assert [job.payload for job in reserved] == [sepp.Payload.bytes(b"wake")]


async def test_worker_drains_through_nginx_tls_without_a_failed_ack(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    jobs = 1200
    expected = {payload_of("work", i) for i in range(jobs)}
    async with sepp.open(sepp_server.address) as direct:
        requests = [
            sepp.EnqueueRequest(QUEUE, "work", payload=sepp.Payload.bytes(p)) for p in expected
        ]
        for start in range(0, jobs, 200):
            await direct.enqueue_batch(requests[start : start + 200])
    handled: Counter[bytes] = Counter()
    log = RecordingLogger()
    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            nginx_proxy(sepp_server.address, tmp_path, keepalive_requests=100) as proxy,
            sepp.open(proxy.tls_address, logger=log, **proxy.tls_options()) as client,
        ):
            worker = sepp.Worker(
                client, QUEUE, lease_duration=60, max_in_flight=32, wait_timeout=2, logger=log
            )

            @worker.handler("work")
            async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                assert payload is not None
                handled[payload.data] += 1
                if len(handled) == jobs:
                    worker.shutdown()

            await worker.run()
    problems = log.at("warning") + log.at("error")
    assert problems == [], f"{len(problems)} warnings/errors, e.g. {problems[:3]}"
    assert_each_once(handled, expected)
    # Nothing is left waiting on the server (a nack would have put its job back). A failed
    # ack leaves its job leased for 60 s; the Worker logs it, which the first check catches.
    assert await jobs_on_server(sepp_server.address) == Counter()


# -- HAProxy -------------------------------------------------------------------------------------


async def test_haproxy_h2_on_both_sides_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with haproxy_proxy(sepp_server.address, tmp_path) as proxy:
            load = await enqueue_through(proxy.address, 2000, tasks=64)
        await check_all_arrived(sepp_server.address, load)
