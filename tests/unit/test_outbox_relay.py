"""The relay's loop, written once: the same claims, sends, settlements, backlog counts and
waits as a task (trio, asyncio) and in a thread (`run_sync`, the loop under `run_blocking`),
against a scripted store and client; database failures anywhere, the wait for rows included,
are counted and backed off from; `shutdown()` ends an idle wait early."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio

import sepp
from sepp._outbox.rows import OutboxRow, row_values
from sepp._outbox.store import Backlog, Claim

GIVE_UP_S = 60.0  # a deadlock breaker only


def rows(*ids: int) -> list[OutboxRow]:
    return [
        OutboxRow(i, row_values(sepp.EnqueueRequest("q", "t", idempotency_key=f"k{i}"), "sqlite"))
        for i in ids
    ]


class ScriptedStore:
    """A listening store whose claims and waits follow a script (an exception: that call
    fails); the relay is shut down when the script ends. Notes every call."""

    dialect = "scripted"
    listens = True

    def __init__(self, relay: sepp.OutboxRelay, claims: list[Any], waits: list[Any]) -> None:
        self.relay = relay
        self.claims = claims
        self.waits = waits
        self.log: list[tuple[object, ...]] = []

    def claim(self, limit: int, claim_s: float) -> Claim:
        self.log.append(("claim", limit))
        step = self.claims.pop(0) if self.claims else None
        if step is None:
            self.relay.shutdown()
            return Claim("t", [])
        if isinstance(step, Exception):
            raise step
        return Claim("t", step)

    def settle(self, token: str, done: list[int], rejected: list[Any], released: list[int]) -> None:
        self.log.append(("settle", done, [row_id for row_id, _ in rejected], released))

    def backlog(self) -> Backlog:
        self.log.append(("backlog",))
        return Backlog(0, 0.0, 0)

    def wait(self, timeout_s: float) -> None:
        self.log.append(("wait",))
        step = self.waits.pop(0) if self.waits else None
        if isinstance(step, Exception):
            raise step

    def close(self) -> None:
        self.log.append(("close",))


class ScriptedClient:
    """Answers each batch by the script: an exception is raised, else every job accepted."""

    def __init__(self, answers: list[Exception | None], log: list[tuple[object, ...]]) -> None:
        self.answers = answers
        self.log = log

    def answer(self, jobs: list[sepp.EnqueueRequest]) -> list[sepp.EnqueueAck | sepp.JobRejection]:
        self.log.append(("send", len(jobs)))
        step = self.answers.pop(0) if self.answers else None
        if step is not None:
            raise step
        return [sepp.EnqueueAck(f"id-{job.idempotency_key}") for job in jobs]


class AsyncClient(ScriptedClient):
    async def enqueue_batch(
        self, jobs: list[sepp.EnqueueRequest], *, timeout: float | None = None
    ) -> list[sepp.EnqueueAck | sepp.JobRejection]:
        await trio.lowlevel.checkpoint()
        return self.answer(jobs)


class SyncClient(ScriptedClient):
    def enqueue_batch(
        self, jobs: list[sepp.EnqueueRequest], *, timeout: float | None = None
    ) -> list[sepp.EnqueueAck | sepp.JobRejection]:
        return self.answer(jobs)


def scripted(tmp_path: Any) -> tuple[sepp.OutboxRelay, ScriptedStore, list[Any]]:
    relay = sepp.OutboxRelay(f"sqlite:///{tmp_path}/unused.db", batch_size=10)
    relay._store.close()
    store = ScriptedStore(
        relay,
        claims=[rows(1, 2, 3), OSError("database is locked"), rows(4, 5), rows(4, 5), [], []],
        waits=[OSError("connection lost")],  # the first wait for rows fails
    )
    relay._store = store  # type: ignore[assignment]
    policy = relay._policy
    # Back off a millisecond rather than half a second and more: the loop, not the policy.
    policy.backoff_s = lambda: 0.001 if policy.failures_in_a_row else 0.0  # type: ignore[method-assign]
    answers: list[Exception | None] = [None, sepp.TransportError("UNAVAILABLE: gone"), None]
    return relay, store, answers


EXPECTED = [
    ("claim", 10),
    ("send", 3),
    ("settle", [1, 2, 3], [], []),
    ("claim", 10),  # fails: counted, the store reconnects, backs off
    ("close",),
    ("backlog",),
    ("claim", 10),
    ("send", 2),  # the server is away: released, backs off
    ("settle", [], [], [4, 5]),
    ("backlog",),
    ("claim", 10),
    ("send", 2),
    ("settle", [4, 5], [], []),
    ("claim", 10),  # nothing: counted, then waits for rows
    ("backlog",),
    ("wait",),  # fails: counted like any database call, the store reconnects
    ("close",),
    ("claim", 10),  # nothing: counted, and it backs off (a sleep, not a wait for rows)
    ("backlog",),
    ("claim", 10),  # the script's end: shut down
    ("backlog",),
    ("close",),  # the relay stopped
]


def check(relay: sepp.OutboxRelay, store: ScriptedStore) -> None:
    assert store.log == EXPECTED
    counters = relay.counters
    assert (counters.relayed, counters.send_failures, counters.db_failures) == (5, 1, 2)


async def test_the_loop_as_a_trio_task(tmp_path: Any) -> None:
    relay, store, answers = scripted(tmp_path)
    with trio.fail_after(GIVE_UP_S):
        await relay.run(AsyncClient(answers, store.log))
    check(relay, store)


def test_the_same_loop_in_a_thread_with_a_sync_client(tmp_path: Any) -> None:
    relay, store, answers = scripted(tmp_path)
    relay.run_sync(SyncClient(answers, store.log))  # type: ignore[arg-type]
    check(relay, store)


def test_the_same_loop_as_an_asyncio_task(tmp_path: Any) -> None:
    import asyncio

    relay, store, answers = scripted(tmp_path)

    class OnAsyncio(ScriptedClient):
        async def enqueue_batch(
            self, jobs: list[sepp.EnqueueRequest], *, timeout: float | None = None
        ) -> list[sepp.EnqueueAck | sepp.JobRejection]:
            await asyncio.sleep(0)
            return self.answer(jobs)

    asyncio.run(asyncio.wait_for(relay.run(OnAsyncio(answers, store.log)), GIVE_UP_S))
    check(relay, store)


def idle_relay(tmp_path: Any) -> tuple[sepp.OutboxRelay, ScriptedStore]:
    """A relay polling an empty table every 1000 s."""
    relay = sepp.OutboxRelay(f"sqlite:///{tmp_path}/unused.db", poll_interval=1000)
    relay._store.close()
    store = ScriptedStore(relay, claims=[[]] * 10, waits=[])
    store.listens = False
    relay._store = store  # type: ignore[assignment]
    return relay, store


async def test_shutdown_ends_a_tasks_idle_wait(tmp_path: Any) -> None:
    relay, store = idle_relay(tmp_path)
    with trio.fail_after(GIVE_UP_S):  # not 1000 s
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run, AsyncClient([], store.log))
            while relay._idle_scope is None:  # noqa: ASYNC110 - until it idles (nothing to wait on)
                await trio.sleep(0.001)
            assert store.log == [("claim", 100), ("backlog",)]
            relay.shutdown()
    assert store.log == [("claim", 100), ("backlog",), ("close",)]


def test_shutdown_ends_a_threads_idle_wait(tmp_path: Any) -> None:
    relay, store = idle_relay(tmp_path)
    waiting = threading.Event()
    store_backlog: Callable[[], Backlog] = store.backlog

    def backlog() -> Backlog:
        waiting.set()  # the next thing it does is wait
        return store_backlog()

    store.backlog = backlog  # type: ignore[method-assign]
    thread = threading.Thread(target=relay.run_sync, args=(SyncClient([], store.log),))
    thread.start()
    assert waiting.wait(GIVE_UP_S)
    relay.shutdown()
    thread.join(GIVE_UP_S)  # not 1000 s
    assert not thread.is_alive()
    assert store.log == [("claim", 100), ("backlog",), ("close",)]


def test_a_relay_runs_once_at_a_time(tmp_path: Any) -> None:
    relay, store = idle_relay(tmp_path)
    relay._running = True
    with pytest.raises(sepp.SeppError, match="already running"):
        relay.run_sync(SyncClient([], store.log))  # type: ignore[arg-type]
