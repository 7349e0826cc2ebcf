"""Probes that answer whatever the handlers do: `/healthz`, `/readyz` and `/metrics` are served
from threads while an `async def` handler burns CPU on the event loop; `/healthz` fails once
the loop has gone `max_loop_lag` without running; a handler holding the loop past
`loop_block_warning` is named in a rate-limited warning.

Every test orders by events: the handler holds the loop (a busy loop, never awaiting) until a
thread of the test has seen what it waits for, so an answer that arrives at all arrived while
the loop was held. The only timeouts are deadlock breakers that turn a hang into a failure."""

from __future__ import annotations

import functools
import http.client
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
from fixtures.fake_client import FakeClient, RecordingLogger

import sepp
from sepp import Retry
from sepp._runtime import concurrency
from sepp._util.log import Log
from sepp._worker import loop_watch
from sepp._worker.monitor import WorkerMonitor
from sepp.testing import job_context

LOOPS = ["trio", "asyncio", pytest.param("uvloop", marks=pytest.mark.needs("uvloop"))]
GIVE_UP_S = 60.0  # a deadlock breaker only: nothing here waits that long unless it is broken


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=GIVE_UP_S / 2)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def burn_until(event: threading.Event) -> None:
    """Hold the event loop with CPU work, never awaiting, until `event` is set."""
    give_up = time.monotonic() + GIVE_UP_S
    while not event.is_set() and time.monotonic() < give_up:
        sum(range(1000))


def run_on(loop: str, main: Callable[[], Any]) -> None:
    if loop == "trio":
        trio.run(main)
    elif loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        import asyncio

        asyncio.run(main())


def run_worker_with_probes(
    loop: str,
    worker: sepp.Worker,
    monitor: WorkerMonitor,
    probe: Callable[[int], None],
) -> None:
    """Serve `monitor`, run `probe(port)` in a thread of its own and `worker` until it stops
    (its handler shuts it down), then stop serving."""
    prober: list[threading.Thread] = []

    async def main() -> None:
        cc = concurrency.current()
        async with cc.open_nursery() as nursery:
            port = await nursery.start(functools.partial(monitor.serve, 0, host="127.0.0.1"))
            prober.append(threading.Thread(target=probe, args=(port,), name="test prober"))
            prober[0].start()
            await worker.run()
            await cc.run_sync_in_thread(prober[0].join)
            nursery.cancel_scope.cancel()

    run_on(loop, main)
    assert not prober[0].is_alive()
    # serve() joined its threads: none is left behind.
    assert not [t for t in threading.enumerate() if t.name.startswith("sepp probe")]


@pytest.mark.parametrize("loop", LOOPS)
def test_probes_answer_while_an_async_handler_holds_the_loop(loop: str) -> None:
    fake = FakeClient()
    job_id = fake.add("burn")
    burning, answered = threading.Event(), threading.Event()
    answers: dict[str, tuple[int, str]] = {}
    monitor = sepp.WorkerMonitor()
    worker = sepp.Worker(
        fake, "q", monitor=monitor, logger=RecordingLogger(), backoff=Retry.DEFAULT
    )

    @worker.handler("burn")
    async def burn(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        burning.set()
        burn_until(answered)
        worker.shutdown()

    def probe(port: int) -> None:
        burning.wait(GIVE_UP_S)
        try:
            for path in ("/healthz", "/readyz", "/metrics"):
                answers[path] = get(port, path)
        finally:
            answered.set()  # only now may the handler give the loop back

    run_worker_with_probes(loop, worker, monitor, probe)
    assert burning.is_set() and fake.acks and fake.acks[0].job_id == job_id
    assert answers["/healthz"][0] == 200
    assert answers["/healthz"][1].startswith("ok: reserving\nevent loop lag: ")
    assert answers["/readyz"][0] == 200
    assert answers["/metrics"][0] == 200
    assert 'sepp_worker_jobs_started_total{queue="q",job_type="burn"} 1' in answers["/metrics"][1]
    assert "\nsepp_worker_event_loop_lag_seconds " in answers["/metrics"][1]


@pytest.mark.parametrize("loop", LOOPS)
def test_healthz_fails_once_the_loop_is_held_past_max_loop_lag(loop: str) -> None:
    fake = FakeClient()
    fake.add("burn")
    burning, failed = threading.Event(), threading.Event()
    seen: list[tuple[int, str]] = []
    monitor = sepp.WorkerMonitor(max_loop_lag=0.05)
    worker = sepp.Worker(
        fake, "q", monitor=monitor, logger=RecordingLogger(), backoff=Retry.DEFAULT
    )

    @worker.handler("burn")
    async def burn(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        burning.set()
        burn_until(failed)

    def probe(port: int) -> None:
        burning.wait(GIVE_UP_S)
        give_up = time.monotonic() + GIVE_UP_S
        try:
            while time.monotonic() < give_up:  # until the lag passes the bound
                seen.append(get(port, "/healthz"))
                if seen[-1][0] == 503:
                    seen.append(get(port, "/readyz"))
                    seen.append(get(port, "/metrics"))
                    break
        finally:
            failed.set()  # the handler gives the loop back
        while time.monotonic() < give_up:  # until the loop runs again
            answer = get(port, "/healthz")
            if answer[0] == 200:
                seen.append(answer)
                break
        worker.shutdown()  # from this thread: a stopped worker is not live either

    run_worker_with_probes(loop, worker, monitor, probe)
    healthz, readyz, metrics, after = seen[-4:]
    assert healthz[0] == 503 and readyz[0] == 503
    assert healthz[1].startswith("not ready: the event loop has not run for ")
    assert "s, over max_loop_lag 0.05s (a handler holds it?); reserving\n" in healthz[1]
    lag = float(healthz[1].split("has not run for ")[1].split("s, ")[0])
    assert lag >= 0.05  # printed to the millisecond
    lag_line = next(x for x in metrics[1].splitlines() if x.startswith("sepp_worker_event_loop"))
    assert float(lag_line.split()[1]) > 0.05
    assert "\nsepp_worker_ready 0\n" in metrics[1]
    assert after[0] == 200  # the loop runs again: healthy again


@pytest.mark.parametrize("loop", LOOPS)
def test_a_handler_holding_the_loop_is_named_in_one_warning(loop: str) -> None:
    fake = FakeClient()
    first, second = fake.add("burn"), fake.add("burn")
    logger = RecordingLogger()

    def logged(level: str, text: str) -> Callable[[], bool]:
        return lambda: any(text in m for m in logger.at(level))

    worker = sepp.Worker(
        fake,
        "q",
        logger=logger,
        backoff=Retry.DEFAULT,
        max_in_flight=1,  # one after the other
        loop_block_warning=0.05,
    )
    done = 0

    @worker.handler("burn")
    async def burn(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        nonlocal done
        # The watch warns about the first, and only logs the second at DEBUG (rate limit).
        level = "warning" if ctx.id == first else "debug"
        give_up = time.monotonic() + GIVE_UP_S
        while not logged(level, f"burn[{ctx.id}]")() and time.monotonic() < give_up:
            sum(range(1000))
        done += 1
        if done == 2:
            worker.shutdown()

    async def main() -> None:
        await worker.run()

    run_on(loop, main)
    assert len(fake.acks) == 2
    warnings = [m for m in logger.at("warning") if "held the event loop" in m]
    assert len(warnings) == 1, warnings
    assert f"job burn[{first}] (attempt 1, queue q) has held the event loop for " in warnings[0]
    assert any(f"job burn[{second}] has held the event loop" in m for m in logger.at("debug"))
    assert not [t for t in threading.enumerate() if t.name.startswith("sepp loop watch")]


def test_the_watch_warns_once_per_step_and_counts_what_it_held_back() -> None:
    logger = RecordingLogger()
    watch = loop_watch.LoopWatch(1.0, Log(logger), "w1")
    a, b, c = (job_context(t, job_id=f"id-{t}") for t in ("a", "b", "c"))
    watch.check(5.0)  # no handler runs
    watch.current = (a, 10.0)
    watch.check(10.9)  # not yet held past the threshold
    assert not logger.records
    watch.check(11.2)
    watch.check(12.0)  # the same step: said already
    assert logger.count("warning") == 1 and "job a[id-a]" in logger.at("warning")[0]
    watch.current = (b, 20.0)
    watch.check(21.5)  # within a minute of the warning: DEBUG
    watch.current = None
    watch.check(40.0)
    watch.current = (c, 75.0)
    watch.check(76.0)  # a minute after the first warning
    assert logger.count("warning") == 2 and logger.count("debug") == 1
    assert "job c[id-c]" in logger.at("warning")[1]
    assert "1 more step(s) held it that long" in logger.at("warning")[1]
    assert "more step" not in logger.at("warning")[0]


def test_the_worker_refuses_a_bad_loop_block_warning() -> None:
    with pytest.raises(sepp.ValidationError, match="loop_block_warning"):
        sepp.Worker(FakeClient(), "q", loop_block_warning=-1)
    with pytest.raises(sepp.ValidationError, match="max_loop_lag"):
        sepp.WorkerMonitor(max_loop_lag=0)
