"""sepp.Scheduler against the real sepp server: several schedulers produce each occurrence once,
jobs carry their occurrence as scheduled_at, and a scheduler started after downtime enqueues
what its `missed` policy says. A missing server binary makes these FAIL, never skip."""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
import trio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode as SpanStatus
from otel_support import install

import sepp
from sepp.testing import ExternalSeppServer, SeppServer
from sepp.testing.pytest_plugin import DEFAULT_TEST_CONFIG

QUEUE = "ticks"
SECOND = timedelta(seconds=1)
# A short dedup window, so missed="all" replays seconds rather than a day of occurrences.
DEDUP_WINDOW_S = 20


@pytest.fixture
def sepp_server_config() -> dict[str, object]:
    config = copy.deepcopy(DEFAULT_TEST_CONFIG)
    storage = config["storage"]
    assert isinstance(storage, dict)
    storage["dedup_window_ms"] = DEDUP_WINDOW_S * 1000
    return config


class Recording:
    """A client that remembers what the scheduler asked and what the server answered."""

    def __init__(self, client: sepp.Client) -> None:
        self.client = client
        self.acks: list[tuple[sepp.EnqueueRequest, sepp.EnqueueAck]] = []
        self.asked: list[sepp.EnqueueRequest] = []  # sent, answered or not
        self.server_times: list[datetime] = []

    async def enqueue(self, request: sepp.EnqueueRequest, /) -> sepp.EnqueueAck:
        self.asked.append(request)
        ack = await self.client.enqueue(request)
        self.acks.append((request, ack))
        return ack

    async def get_server_info(self) -> sepp.ServerInfo:
        info = await self.client.get_server_info()
        self.server_times.append(info.server_time)
        return info

    def occurrences(self) -> set[datetime]:
        """The occurrences the server answered for."""
        return {r.scheduled_at for r, _ in self.acks if r.scheduled_at is not None}

    def asked_occurrences(self) -> set[datetime]:
        """The occurrences asked for, answered or not: an enqueue cut off by shutdown may
        still have made its job (a run once found one past the answered ones)."""
        return {r.scheduled_at for r in self.asked if r.scheduled_at is not None}


def ticks(suffix: str = "") -> sepp.Schedule:
    """Schedule `tick{suffix}`, one job a second on queue `ticks{suffix}`."""
    return sepp.Schedule().every(
        f"tick{suffix}", 1, QUEUE + suffix, "tick", custom={"origin": "test"}
    )


def scheduler(
    client: Recording, missed: sepp._scheduling.schedule.Missed = "latest", suffix: str = ""
) -> sepp.Scheduler:
    return sepp.Scheduler(
        client, ticks(suffix), lookahead=1, missed=missed, grace=0, dedup_window=DEDUP_WINDOW_S
    )


def parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def seconds(start: datetime, stop: datetime) -> list[datetime]:
    """Every whole second from start to stop, both included."""
    return [start + i * SECOND for i in range(int((stop - start) / SECOND) + 1)]


async def server_time(client: sepp.Client) -> datetime:
    return (await client.get_server_info()).server_time


async def reserve(client: sepp.Client, *, wait_timeout: float, suffix: str = "") -> list[sepp.Job]:
    jobs = await client.reserve(
        QUEUE + suffix, lease_duration=60, wait_timeout=wait_timeout, max_jobs=256
    )
    return jobs or []


async def reserve_all(
    client: sepp.Client, expected: set[datetime], suffix: str = ""
) -> list[sepp.Job]:
    """Every job on the queue once the expected occurrences are ready, plus any extra one."""
    jobs: list[sepp.Job] = []
    # Scheduled jobs become ready when the server's sweep (about once a second) promotes them.
    with trio.fail_after(30):
        while not expected <= {job.ctx.scheduled_at for job in jobs}:
            jobs += await reserve(client, wait_timeout=2, suffix=suffix)
    jobs += await reserve(client, wait_timeout=1.5, suffix=suffix)
    return jobs


def occurrences_of(jobs: list[sepp.Job], suffix: str = "") -> Counter[datetime]:
    """Jobs per occurrence, checking each job describes its occurrence consistently."""
    counts: Counter[datetime] = Counter()
    for job in jobs:
        custom = job.ctx.custom
        occurrence = parse(str(custom["sepp.occurrence"]))
        assert job.ctx.scheduled_at == occurrence
        assert custom["sepp.schedule"] == f"tick{suffix}" and custom["origin"] == "test"
        assert (job.ctx.queue, job.ctx.job_type) == (QUEUE + suffix, "tick")
        counts[occurrence] += 1
    return counts


async def test_three_schedulers_produce_each_occurrence_exactly_once(
    sepp_server: SeppServer | ExternalSeppServer,
) -> None:
    async with (
        sepp.open(sepp_server.address) as a,
        sepp.open(sepp_server.address) as b,
        sepp.open(sepp_server.address) as c,
    ):
        clients = [Recording(a), Recording(b), Recording(c)]
        async with trio.open_nursery() as nursery:
            schedulers = [scheduler(client) for client in clients]
            for each in schedulers:
                await nursery.start(each.run)
            await trio.sleep(5)
            for each in schedulers:
                each.shutdown()
        requested = set().union(*(client.occurrences() for client in clients))
        jobs = await reserve_all(a, requested)
    counts = occurrences_of(jobs)
    # None twice, none missing: one job for every second from the first to the last, every
    # answered occurrence among them, and none that was not asked for.
    asked = set().union(*(client.asked_occurrences() for client in clients))
    assert set(counts.values()) == {1}
    assert requested <= set(counts) <= asked
    assert sorted(counts) == seconds(min(counts), max(counts))
    assert len(counts) >= 6  # five seconds of ticks, one second ahead
    # The three really competed: most occurrences were asked for by all of them, and the
    # server created exactly one job for each, deduplicating the rest.
    acks = defaultdict(list)
    for client in clients:
        for request, ack in client.acks:
            acks[request.scheduled_at].append(ack)
    assert sum(len(by_all) == 3 for by_all in acks.values()) >= 4
    for by_occurrence in acks.values():
        assert [ack.deduplicated for ack in by_occurrence].count(False) == 1
        assert len({ack.job_id for ack in by_occurrence}) == 1
    assert {job.id for job in jobs} == {ack.job_id for by in acks.values() for ack in by}


async def test_a_scheduler_started_after_downtime_enqueues_per_its_missed_policy(
    client: sepp.Client,
) -> None:
    # The three policies side by side, each with a schedule and a queue of its own: each
    # waits out 11 s of scheduler runs and downtime, so one after another would take 33.
    async def one(missed: sepp._scheduling.schedule.Missed) -> None:
        try:
            await downtime_then_resume(client, missed)
        except AssertionError as exc:
            raise AssertionError(f"missed={missed!r}: {exc}") from exc

    async with trio.open_nursery() as nursery:
        for missed in ("latest", "all", "skip"):
            nursery.start_soon(one, missed)


async def downtime_then_resume(
    client: sepp.Client, missed: sepp._scheduling.schedule.Missed
) -> None:
    suffix = f"-{missed}"
    first = Recording(client)
    async with trio.open_nursery() as nursery:
        # "all" replays what came after the newest occurrence some scheduler enqueued, found by
        # bisection, which assumes no gap before that one: so its schedule is first deployed
        # under "all" too (replaying the dedup window), the others' under "skip".
        before = scheduler(first, "all" if missed == "all" else "skip", suffix)
        await nursery.start(before.run)
        first_low, first_high = first.server_times[0], await server_time(client)
        await trio.sleep(2.5)
        before.shutdown()
    done_before = first.occurrences()
    await trio.sleep(4.5)  # no scheduler runs: occurrences go by

    second = Recording(client)
    async with trio.open_nursery() as nursery:
        after = scheduler(second, missed, suffix)
        await nursery.start(after.run)
        # The second scheduler planned at a server time between these two readings.
        low, high = second.server_times[0], await server_time(client)
        await trio.sleep(1.5)
        after.shutdown()
    requested = done_before | second.occurrences()
    counts = occurrences_of(await reserve_all(client, requested, suffix), suffix)
    assert set(counts.values()) == {1}
    got = sorted(counts)

    last_before = max(done_before)
    assert sorted(done_before) == seconds(min(done_before), last_before)
    resumed = min(t for t in got if t > last_before)
    if missed == "all":
        # The first deployment replayed its dedup window (less lookahead and margin: 14 s) and
        # nothing older; the restart replayed the downtime, leaving no gap, and nothing twice.
        oldest_kept = DEDUP_WINDOW_S - 1 - 5
        assert got == seconds(got[0], got[-1])
        assert first_low - oldest_kept * SECOND < got[0]
        assert got[0] <= first_high - (oldest_kept - 1) * SECOND
        assert second.occurrences() - done_before >= set(seconds(last_before + SECOND, low))
    else:
        assert [t for t in got if t <= last_before] == sorted(done_before)
        assert resumed - last_before >= 3 * SECOND  # the downtime left a gap ...
        assert got[got.index(resumed) :] == seconds(resumed, got[-1])  # ... then none
        if missed == "latest":  # ... after the newest missed occurrence
            assert low - SECOND < resumed <= high
        else:  # ... after the first occurrence still to come
            assert low < resumed <= high + SECOND


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter, _ = install()
    yield exporter
    exporter.clear()


async def test_each_enqueue_of_an_occurrence_is_an_ordinary_enqueue_span(
    client: sepp.Client, spans: InMemorySpanExporter
) -> None:
    recording = Recording(client)
    async with trio.open_nursery() as nursery:
        each = scheduler(recording, "skip")
        await nursery.start(each.run)
        await trio.sleep(2)
        each.shutdown()
    finished = [s for s in spans.get_finished_spans() if s.name == "sepp.enqueue"]
    # shutdown() abandons an enqueue in flight (by design: the key makes it safe to repeat);
    # its span ends with no job id and no error set, as a cancelled call's does (PyPy in a
    # full run caught one).
    enqueues = [s for s in finished if "sepp.job_id" in dict(s.attributes or {})]
    abandoned = [s for s in finished if s not in enqueues]
    assert len(abandoned) <= 1
    assert all(s.status.status_code is SpanStatus.UNSET for s in abandoned)
    assert len(enqueues) == len(recording.acks) >= 2
    job_ids = {dict(s.attributes or {})["sepp.job_id"] for s in enqueues}
    assert job_ids == {ack.job_id for _, ack in recording.acks}
