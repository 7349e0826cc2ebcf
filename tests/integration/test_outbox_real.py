"""sepp.Outbox and its relay against the real server and real databases (a sqlite3 file and a
throw-away PostgreSQL cluster): every committed job arrives once, and only committed ones,
with the server down for a while and two relays on one table; rejections are kept, not lost.
(The processes killed at random: test_outbox_crashes_real.py.)"""

from __future__ import annotations

import copy
import threading
import urllib.request

import pytest
import trio
from fixtures import outbox as fixtures
from fixtures.outbox import (
    add_orders,
    connect,
    consume_all,
    drain_when_empty,
    once_each,
    rows_left,
    until,
)

import sepp
from sepp.testing import SeppServer
from sepp.testing.pytest_plugin import DEFAULT_TEST_CONFIG

database = fixtures.database
pg_cluster = fixtures.pg_cluster


@pytest.fixture
def sepp_server_config() -> dict[str, object]:
    config = copy.deepcopy(DEFAULT_TEST_CONFIG)
    config["queues"] = [{"name": "strict", "allowed_job_types": ["ok"]}]
    return config


class Recording:
    """A client that notes what the relay sends, in order."""

    def __init__(self, client: sepp.Client) -> None:
        self.client = client
        self.sent: list[str] = []
        self.sizes: list[int] = []

    async def enqueue_batch(
        self, jobs: list[sepp.EnqueueRequest], *, timeout: float | None = None
    ) -> list[sepp.EnqueueAck | sepp.JobRejection]:
        self.sent += [job.payload.json()["item"] for job in jobs if job.payload]
        self.sizes.append(len(jobs))
        return await self.client.enqueue_batch(jobs, timeout=timeout)


async def test_rolled_back_jobs_never_leave_and_committed_ones_arrive_oldest_first(
    database: str, sepp_server: SeppServer
) -> None:
    outbox = sepp.Outbox()
    with connect(database) as conn:
        outbox.add(conn, "orders", "ship", payload=sepp.Payload.json({"item": "rolled back"}))
        conn.rollback()
    items = [f"item-{i:03}" for i in range(250)]
    add_orders(database, items)
    relay = sepp.OutboxRelay(database, batch_size=40)
    async with sepp.open(sepp_server.address) as client, trio.open_nursery() as nursery:
        recording = Recording(client)
        await nursery.start(relay.run, recording)
        await drain_when_empty(database)
        relay.shutdown()
    assert recording.sent == items  # oldest first
    assert max(recording.sizes) == 40
    jobs = await consume_all(sepp_server.address, ["orders"], len(items))
    assert sorted(once_each(jobs).elements()) == items
    assert relay.counters.relayed == len(items)
    assert relay.counters.deduplicated == 0
    assert rows_left(database) == (0, 0)


async def test_a_rejected_job_is_kept_with_its_reason_and_the_rest_go(
    database: str, sepp_server: SeppServer
) -> None:
    outbox = sepp.Outbox()
    with connect(database) as conn:
        outbox.add(conn, "strict", "ok", payload=sepp.Payload.json({"item": "a"}))
        outbox.add(conn, "strict", "not-allowed", payload=sepp.Payload.json({"item": "b"}))
        outbox.add(conn, "strict", "ok", payload=sepp.Payload.json({"item": "c"}))
        conn.commit()
    relay = sepp.OutboxRelay(database)
    async with sepp.open(sepp_server.address) as client, trio.open_nursery() as nursery:
        await nursery.start(relay.run, client)
        await until(lambda: rows_left(database) == (0, 1))
        relay.shutdown()
    assert relay.counters.rejected == 1
    with connect(database) as conn:
        cur = conn.cursor()
        cur.execute("SELECT job_type, rejection FROM sepp_outbox")
        [(job_type, reason)] = cur.fetchall()
    assert job_type == "not-allowed"
    assert "JobTypeNotAllowed" in reason
    jobs = await consume_all(sepp_server.address, ["strict"], 2)
    assert once_each(jobs) == {"a": 1, "c": 1}


async def test_with_the_server_down_for_a_while_nothing_is_lost_or_doubled(
    database: str, sepp_server: SeppServer
) -> None:
    items = [f"early-{i}" for i in range(100)]
    add_orders(database, items)
    relay = sepp.OutboxRelay(database, batch_size=30)
    async with sepp.open(sepp_server.address) as client, trio.open_nursery() as nursery:
        await sepp_server.stop()
        await nursery.start(relay.run, client)
        await until(lambda: relay.counters.send_failures >= 3)  # it backs off and retries
        late = [f"late-{i}" for i in range(100)]
        add_orders(database, late)  # the application goes on while the server is down
        assert rows_left(database) == (200, 0)
        await sepp_server.start()
        await drain_when_empty(database)
        relay.shutdown()
    jobs = await consume_all(sepp_server.address, ["orders"], 200)
    counts = once_each(jobs)
    assert set(counts) == {*items, *late}
    assert set(counts.values()) == {1}
    assert relay.counters.relayed + relay.counters.deduplicated == 200


class MeetFirst:
    """A client whose first send waits until the other relay is in its first send too: both
    hold a claimed batch at once, whatever the scheduler does (a loaded CI machine let one relay
    take all 600 rows before the other looked once)."""

    def __init__(self, client: sepp.Client, arrived: list[trio.Event], index: int) -> None:
        self.client = client
        self.arrived = arrived
        self.index = index
        self.first: list[str] = []

    async def enqueue_batch(
        self, jobs: list[sepp.EnqueueRequest], *, timeout: float | None = None
    ) -> list[sepp.EnqueueAck | sepp.JobRejection]:
        if not self.arrived[self.index].is_set():
            self.first = [job.payload.json()["item"] for job in jobs if job.payload]
            self.arrived[self.index].set()
            await self.arrived[1 - self.index].wait()
        return await self.client.enqueue_batch(jobs, timeout=timeout)


async def test_two_relays_on_one_table_never_send_a_row_twice(
    database: str, sepp_server: SeppServer
) -> None:
    items = [f"item-{i}" for i in range(600)]
    add_orders(database, items)
    relays = [sepp.OutboxRelay(database, batch_size=25) for _ in range(2)]
    arrived = [trio.Event(), trio.Event()]
    async with sepp.open(sepp_server.address) as client, trio.open_nursery() as nursery:
        clients = [MeetFirst(client, arrived, i) for i in range(2)]
        for relay, meeting in zip(relays, clients, strict=True):
            await nursery.start(relay.run, meeting)
        await drain_when_empty(database)
        for relay in relays:
            relay.shutdown()
    # Both held a batch at the same moment, and the claims kept them apart.
    first = [set(c.first) for c in clients]
    assert all(first) and not first[0] & first[1]
    jobs = await consume_all(sepp_server.address, ["orders"], len(items))
    counts = once_each(jobs)
    assert set(counts) == set(items) and set(counts.values()) == {1}
    # No row went out twice, so none came back deduplicated.
    assert [r.counters.deduplicated for r in relays] == [0, 0]
    assert sum(r.counters.relayed for r in relays) == len(items)
    assert all(r.counters.relayed > 0 for r in relays)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return response.read().decode()


async def test_the_relay_wakes_for_new_rows_and_reports_its_backlog(
    database: str, sepp_server: SeppServer
) -> None:
    relay = sepp.OutboxRelay(database, poll_interval=0.05)
    async with sepp.open(sepp_server.address) as client, trio.open_nursery() as nursery:
        await nursery.start(relay.run, client)
        for round_ in range(3):
            add_orders(database, [f"r{round_}"])
            await until(lambda n=round_ + 1: relay.counters.relayed == n)
        await sepp_server.stop()
        add_orders(database, ["stuck-1", "stuck-2"])
        await until(lambda: relay.backlog.waiting == 2)
        # The backlog is counted from the table: wait for a send to have failed too (py3.15's
        # part scraped between the two once).
        await until(lambda: relay.counters.send_failures > 0)
        port = await nursery.start(relay.serve_metrics, 0)
        text = await trio.to_thread.run_sync(scrape, port)
        assert 'sepp_outbox_waiting{table="sepp_outbox"} 2' in text
        assert 'sepp_outbox_relayed_total{table="sepp_outbox"} 3' in text
        assert 'sepp_outbox_failures_in_a_row{table="sepp_outbox"} 0' not in text
        await sepp_server.start()
        await drain_when_empty(database)
        relay.shutdown()
        nursery.cancel_scope.cancel()  # the metrics server
    assert relay.counters.relayed == 5


async def test_the_relay_runs_in_a_thread_with_a_sync_client(
    database: str, sepp_server: SeppServer
) -> None:
    items = [f"t{i}" for i in range(50)]
    add_orders(database, items)
    relay = sepp.OutboxRelay(database, batch_size=20)
    with sepp.SyncClient(sepp_server.address) as client:
        thread = threading.Thread(target=relay.run_sync, args=(client,), kwargs={"metrics_port": 0})
        thread.start()
        try:
            await drain_when_empty(database)
            await until(lambda: relay.metrics_port is not None)
            await until(lambda: relay.counters.relayed == len(items))
            assert relay.metrics_port is not None
            text = await trio.to_thread.run_sync(scrape, relay.metrics_port)
            assert f'sepp_outbox_relayed_total{{table="sepp_outbox"}} {len(items)}' in text
        finally:
            relay.shutdown()
            await trio.to_thread.run_sync(thread.join)
    assert relay.counters.relayed == len(items)
    assert relay.metrics_port is None  # served while it ran
    with pytest.raises(sepp.ValidationError, match="metrics_port"):
        relay.run_sync(client, metrics_port=70000)
    jobs = await consume_all(sepp_server.address, ["orders"], len(items))
    assert sorted(once_each(jobs).elements()) == sorted(items)


async def test_the_relay_runs_under_asyncio(database: str, sepp_server: SeppServer) -> None:
    import asyncio

    import anyio

    items = [f"a{i}" for i in range(50)]
    add_orders(database, items)
    relay = sepp.OutboxRelay(database, batch_size=20)

    scraped: list[str] = []

    async def main() -> None:
        async with sepp.open(sepp_server.address) as client, anyio.create_task_group() as tg:
            await tg.start(relay.run, client)
            async with anyio.create_task_group() as serving:
                port = await serving.start(relay.serve_metrics, 0)
                while rows_left(database)[0]:  # noqa: ASYNC110 - another thread empties it
                    await asyncio.sleep(0.05)
                scraped.append(await anyio.to_thread.run_sync(scrape, port))
                serving.cancel_scope.cancel()
            relay.shutdown()

    await trio.to_thread.run_sync(asyncio.run, main())
    assert relay.counters.relayed == len(items)
    assert f'sepp_outbox_relayed_total{{table="sepp_outbox"}} {len(items)}' in scraped[0]
    jobs = await consume_all(sepp_server.address, ["orders"], len(items))
    assert sorted(once_each(jobs).elements()) == sorted(items)
