"""sepp.Scheduler under trio's MockClock, against a scripted stand-in for the client's
`enqueue` and `get_server_info` whose server clock runs at FAKE_EPOCH + offset + trio time."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import pairwise

import pytest
import trio
from fixtures.fake_client import RecordingLogger
from fixtures.fake_scheduler_server import FAKE_EPOCH, FakeServer, at
from trio.testing import MockClock

import sepp
from sepp import StatusCode
from sepp._model import backoff as _backoff

pytestmark = pytest.mark.fixture  # counted with the tests that run against a scripted fake


def gaps_between(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in pairwise(times)]


def unavailable() -> sepp.TransportError:
    return sepp.TransportError("UNAVAILABLE: connection refused", code=StatusCode.UNAVAILABLE)


def every(seconds: float, name: str = "tick", queue: str = "q") -> sepp.Schedule:
    return sepp.Schedule().every(name, seconds, queue, "t")


async def run_for(scheduler: sepp.Scheduler, seconds: float) -> None:
    """Run the scheduler until trio time `seconds` (the test starts at 0), then shut it down."""
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await trio.sleep_until(seconds)
        scheduler.shutdown()


# -- alignment, lookahead, the server's clock --------------------------------------------------


async def test_each_occurrence_is_enqueued_lookahead_ahead_with_its_time_key_and_custom(
    autojump_clock: MockClock,
) -> None:
    # The server's clock reads 2030 + 1234.5 s, whatever the host's says: that is the reference.
    fake = FakeServer(offset_s=1234.5)
    scheduler = sepp.Scheduler(fake, every(10), lookahead=3, missed="skip", grace=0)
    await run_for(scheduler, 40)
    # Occurrences at 1240, 1250, ... each enqueued 3 s before it on the server's clock.
    assert [(c.at, c.request.scheduled_at) for c in fake.calls] == [
        (1237 - 1234.5, at(1240)),
        (1247 - 1234.5, at(1250)),
        (1257 - 1234.5, at(1260)),
        (1267 - 1234.5, at(1270)),
    ]
    first = fake.calls[0].request
    assert first.idempotency_key == "sepp-schedule:tick:2030-01-01T00:20:40Z"
    assert dict(first.custom) == {
        "sepp.schedule": "tick",
        "sepp.occurrence": "2030-01-01T00:20:40Z",
    }
    assert (first.queue, first.job_type) == ("q", "t")


async def test_a_cron_schedule_is_enqueued_ahead_of_each_match(autojump_clock: MockClock) -> None:
    fake = FakeServer(offset_s=30)
    schedule = sepp.Schedule().cron("minutely", "* * * * *", "q", "t")
    await run_for(sepp.Scheduler(fake, schedule, lookahead=5, missed="skip", grace=0), 90)
    assert [(c.at, c.request.scheduled_at) for c in fake.calls] == [(25, at(60)), (85, at(120))]


async def test_the_server_clock_is_re_read_and_followed(autojump_clock: MockClock) -> None:
    fake = FakeServer(offset_s=1)

    async def step_the_server_clock() -> None:
        await trio.sleep(50)
        fake.offset_s += 100  # an NTP step on the server

    async with trio.open_nursery() as nursery:
        nursery.start_soon(step_the_server_clock)
        await run_for(sepp.Scheduler(fake, every(60), lookahead=5, missed="latest"), 320)
    assert fake.info_calls == [0, 300]
    times = {c.request.scheduled_at: c.at for c in fake.calls}
    # Until the re-read, occurrence T goes out at T - 5 by the old reading (trio T - 6) ...
    assert [times[at(t)] for t in (60, 120, 180, 240, 300)] == [54, 114, 174, 234, 294]
    # ... after it, at 300 the server says 401: 360 is overdue (the latest: enqueued now) and
    # 420 goes out at 415 by the new reading (trio 314).
    assert times[at(360)] == 300 and times[at(420)] == 314


# -- missed occurrences at start ---------------------------------------------------------------

# The server says X + 150 s, X a multiple of the minute; entries every 60 s; a one-hour dedup
# window leaves 3600 - 10 (lookahead) - 5 (clock margin) = 3585 s in which keys are trusted.
X = 5 * 3600


@pytest.mark.parametrize(
    ("missed", "expected"),
    [
        ("latest", [at(X + 120)]),
        ("skip", [at(X + 60), at(X + 120)]),  # grace 90 s: those at most 90 s old
        ("all", [at(X + s) for s in range(-3420, 121, 60)]),  # (X + 150 - 3585, X + 150]
    ],
)
async def test_missed_policy_at_start(
    autojump_clock: MockClock, missed: sepp._scheduling.schedule.Missed, expected: list[datetime]
) -> None:
    fake = FakeServer(offset_s=X + 150)
    # Another scheduler already enqueued two of them: the server deduplicates those.
    for occurrence in (at(X), at(X - 60)):
        request = every(60)._entries["tick"].request(occurrence)
        assert request.idempotency_key is not None
        fake.jobs[request.idempotency_key] = request
    scheduler = sepp.Scheduler(
        fake, every(60), lookahead=10, missed=missed, grace=90, dedup_window=3600
    )
    await run_for(scheduler, 5)
    assert len(expected) == {"latest": 1, "skip": 2, "all": 60}[missed]
    enqueued = sorted(c.request.scheduled_at for c in fake.calls if c.request.scheduled_at)
    assert enqueued == expected
    assert fake.occurrences() == sorted({*expected, at(X), at(X - 60)})
    assert all(c.at == 0 for c in fake.calls)  # past occurrences go out at once


def enqueued_before(fake: FakeServer, occurrences: Sequence[datetime]) -> None:
    """As if an earlier scheduler had enqueued these occurrences of every(60)."""
    for occurrence in occurrences:
        request = every(60)._entries["tick"].request(occurrence)
        assert request.idempotency_key is not None
        fake.jobs[request.idempotency_key] = request


@pytest.mark.parametrize("missed_count", [0, 1, 7, 60])
async def test_missed_all_replays_only_what_this_start_missed(
    autojump_clock: MockClock, missed_count: int
) -> None:
    fake = FakeServer(offset_s=X + 150)
    window = [at(X + s) for s in range(-3420, 121, 60)]  # the 60 occurrences "all" may replay
    done, missed = window[: len(window) - missed_count], window[len(window) - missed_count :]
    enqueued_before(fake, done)  # a scheduler ran until the last `len(done)` of them
    log = RecordingLogger()
    scheduler = sepp.Scheduler(
        fake, every(60), lookahead=10, missed="all", dedup_window=3600, logger=log
    )
    await run_for(scheduler, 5)
    assert fake.occurrences() == window
    created = [c.request.scheduled_at for c in fake.succeeded() if not c.deduplicated]
    assert sorted(created) == missed  # each missed occurrence once
    # A probe of the newest, then a bisection: not a call for each of the 60.
    probes = [c for c in fake.calls if c.deduplicated]
    assert len(fake.calls) == missed_count + len(probes) and len(probes) <= 7
    if missed_count < len(window):
        assert log.matching(f"{len(done)} of 60 past occurrence(s) of 'tick' were enqueued")


async def test_missed_all_replays_in_order_after_the_probes(autojump_clock: MockClock) -> None:
    fake = FakeServer(offset_s=X + 150)
    window = [at(X + s) for s in range(-3420, 121, 60)]
    enqueued_before(fake, window[:40])
    await run_for(sepp.Scheduler(fake, every(60), lookahead=10, missed="all", dedup_window=3600), 5)
    created = [c.request.scheduled_at for c in fake.succeeded() if not c.deduplicated]
    # The bisection's own finds go first (at most a handful); the rest follow in order.
    replayed = [t for t in created if t not in created[:6]]
    assert replayed == sorted(replayed) and sorted(created) == window[40:]


@pytest.mark.parametrize("first_deployed", [1, 20, 29, 30, 31, 45, 55])
async def test_missed_all_after_a_first_deployment_under_skip_replays_all_it_missed(
    autojump_clock: MockClock, first_deployed: int
) -> None:
    # The window holds a gap (before the first deployment), what was enqueued, then the
    # downtime: the bisection cannot tell the gap from missed, so it may replay the gap too,
    # but never leaves out a missed occurrence, nor makes a hole in what it replays.
    fake = FakeServer(offset_s=X + 150)
    window = [at(X + s) for s in range(-3420, 121, 60)]
    enqueued_before(fake, window[first_deployed:56])
    await run_for(sepp.Scheduler(fake, every(60), lookahead=10, missed="all", dedup_window=3600), 5)
    created = sorted(c.request.scheduled_at for c in fake.succeeded() if not c.deduplicated)
    assert set(window[56:]) <= set(created) <= set(window) - set(window[first_deployed:56])
    assert created in (window[56:], window[:first_deployed] + window[56:])
    assert fake.occurrences() == sorted({*window[first_deployed:56], *created})


@pytest.mark.parametrize("missed", ["latest", "skip", "all"])
async def test_a_past_occurrence_no_scheduler_enqueued_is_logged_at_start(
    autojump_clock: MockClock, missed: sepp._scheduling.schedule.Missed
) -> None:
    log = RecordingLogger()
    fake = FakeServer(offset_s=X + 150)
    scheduler = sepp.Scheduler(
        fake, every(60), lookahead=10, missed=missed, grace=90, dedup_window=3600, logger=log
    )
    await run_for(scheduler, 5)
    first_deploy = log.matching("was due before this start and no scheduler had enqueued it")
    assert len(first_deploy) == 1 and f"missed={missed!r}" in first_deploy[0][1]


async def test_a_restart_that_missed_nothing_logs_no_first_start_warning(
    autojump_clock: MockClock,
) -> None:
    log = RecordingLogger()
    fake = FakeServer(offset_s=X + 150)
    enqueued_before(fake, [at(X + 120)])
    await run_for(sepp.Scheduler(fake, every(60), lookahead=10, logger=log), 5)
    assert [c.deduplicated for c in fake.calls] == [True]
    assert not log.matching("no scheduler had enqueued it")


# -- missed occurrences while the server is down -----------------------------------------------


@pytest.mark.parametrize("missed", ["latest", "all", "skip"])
async def test_missed_policy_after_a_server_outage(
    autojump_clock: MockClock, missed: sepp._scheduling.schedule.Missed
) -> None:
    fake = FakeServer(offset_s=5)
    fake.enqueue_error = lambda r: unavailable() if 10 <= trio.current_time() < 100 else None
    scheduler = sepp.Scheduler(
        fake, every(10), lookahead=2, missed=missed, grace=15, dedup_window=600
    )
    await run_for(scheduler, 150)
    recovered_at = min(c.at for c in fake.succeeded() if c.at >= 100)
    server_now = fake.server_seconds(recovered_at)
    got = [(o - FAKE_EPOCH).total_seconds() for o in fake.occurrences()]
    before = [t for t in got if t <= 10]  # enqueued before the outage
    during = [t for t in got if 10 < t <= server_now]
    after = [t for t in got if t > server_now]
    # Everything that came due after the outage went out, with no gap.
    assert after == [t for t in range(110, 160, 10) if t > server_now]
    missed_ones = list(range(20, int(server_now) + 1, 10))
    if missed == "all":
        assert during == missed_ones
        assert before == list(range(-580, 11, 10))  # the last 593 s at start
    elif missed == "latest":
        assert during == missed_ones[-1:]
        assert before == [0, 10]
    else:
        assert during == [t for t in missed_ones if t >= server_now - 15]
        assert before == [-10, 0, 10]  # at most 15 s old at start
    assert len(during) >= 1 and (missed == "all" or len(during) < len(missed_ones))
    # Each occurrence was enqueued once: nothing to deduplicate with one scheduler.
    assert not any(c.deduplicated for c in fake.succeeded())


@pytest.mark.parametrize("seed", range(8))
async def test_dropped_occurrences_are_logged(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # The backoff's jitter from a seeded generator, so each case is the same every run (with
    # the test ending at 80, seed 3 once left the recovery at 83). The outage ends at 60 and
    # the backoff is at most 30 s: the recovery is logged by 90 whatever the draws.
    monkeypatch.setattr(_backoff, "random", random.Random(seed))
    fake = FakeServer(offset_s=5)
    fake.enqueue_error = lambda r: unavailable() if trio.current_time() < 60 else None
    log = RecordingLogger()
    await run_for(sepp.Scheduler(fake, every(10), lookahead=2, grace=0, logger=log), 90)
    dropped = [m for m in log.at("warning") if "dropped" in m]
    assert dropped and all("missed='latest'" in m for m in dropped)
    assert log.matching("enqueue works again after")
    assert any("UNAVAILABLE" in m for m in log.at("warning"))


# -- failures and backoff ----------------------------------------------------------------------


async def test_an_unreachable_server_is_retried_with_growing_jittered_backoff(
    autojump_clock: MockClock,
) -> None:
    fake = FakeServer(offset_s=3570)  # the hourly occurrence at 3600 is within the lookahead
    fake.enqueue_error = lambda r: unavailable()
    scheduler = sepp.Scheduler(fake, every(3600), lookahead=60)
    await run_for(scheduler, 400)
    times = [c.at for c in fake.calls]
    gaps = gaps_between(times)
    steps = [min(2.0**i, 30.0) for i in range(len(gaps))]
    assert len(gaps) >= 15
    for gap, step in zip(gaps, steps, strict=True):
        assert step / 2 <= gap <= step
    # Only one attempt per wake-up: the other occurrences wait instead of failing too.
    assert fake.info_calls == [0, 300]


async def test_the_loop_outlives_unexpected_exceptions(autojump_clock: MockClock) -> None:
    fake = FakeServer(offset_s=5)
    failures = iter([RuntimeError("bug in a proxy"), KeyError("x")])
    fake.enqueue_error = lambda r: next(failures, None)
    log = RecordingLogger()
    await run_for(sepp.Scheduler(fake, every(10), lookahead=2, logger=log), 30)
    assert [type(c.error) for c in fake.calls[:2]] == [RuntimeError, KeyError]
    assert fake.occurrences() == [at(0), at(10), at(20), at(30)]
    assert any("unexpected RuntimeError: bug in a proxy" in m for m in log.at("error"))


async def test_a_refused_entry_does_not_hold_back_the_others(autojump_clock: MockClock) -> None:
    fake = FakeServer(offset_s=5)
    fake.enqueue_error = lambda r: (
        sepp.JobRejectedError(sepp.UnknownQueue(r.queue)) if r.queue == "nope" else None
    )
    schedule = every(10, "good").every("bad", 10, "nope", "t")
    log = RecordingLogger()
    scheduler = sepp.Scheduler(fake, schedule, lookahead=2, missed="skip", grace=5, logger=log)
    await run_for(scheduler, 40)
    good = [(c.at, c.request.scheduled_at) for c in fake.calls if c.request.queue == "q"]
    assert good == [(0, at(0)), (3, at(10)), (13, at(20)), (23, at(30)), (33, at(40))]
    bad = [c for c in fake.calls if c.request.queue == "nope"]
    assert bad and all(isinstance(c.error, sepp.JobRejectedError) for c in bad)
    # Each refused occurrence is retried with its own backoff, until `grace` after it.
    for occurrence in {c.request.scheduled_at for c in bad} - {at(0)}:
        assert occurrence is not None
        tries = [c.at for c in bad if c.request.scheduled_at == occurrence]
        assert len(tries) >= 2
        assert all(at(fake.server_seconds(t)) <= occurrence + timedelta(seconds=5) for t in tries)
        assert all(0.5 <= gap <= 2**i for i, gap in enumerate(gaps_between(tries)))
    assert any("unknown queue" in m.lower() and "'bad'" in m for m in log.at("error"))
    assert any("dropped (missed='skip')" in m for m in log.at("warning"))


# -- starting and stopping ---------------------------------------------------------------------


async def test_start_waits_for_the_server_and_retries_reading_its_clock(
    autojump_clock: MockClock,
) -> None:
    fake = FakeServer(offset_s=5)
    fake.info_error = lambda: unavailable() if len(fake.info_calls) <= 3 else None
    log = RecordingLogger()
    scheduler = sepp.Scheduler(fake, every(10), lookahead=2, logger=log)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        assert len(fake.info_calls) == 4 and trio.current_time() == fake.info_calls[3]
        gaps = gaps_between(fake.info_calls)
        assert all(2**i / 2 <= gap <= 2**i for i, gap in enumerate(gaps))
        assert len(log.matching("cannot read the server's clock")) == 3
        await trio.sleep(1)
        scheduler.shutdown()
    assert fake.calls  # it went on to enqueue


async def test_shutdown_stops_the_loop(autojump_clock: MockClock) -> None:
    fake = FakeServer(offset_s=5)
    scheduler = sepp.Scheduler(fake, every(10), lookahead=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await trio.sleep(20)
        assert not scheduler.is_shutdown
        scheduler.shutdown()
        scheduler.shutdown()  # idempotent
    assert scheduler.is_shutdown
    stopped_at, made = trio.current_time(), len(fake.calls)
    assert stopped_at == 20 and made == 3  # 0, 10 and 20 (at 13)
    await trio.sleep(100)
    assert len(fake.calls) == made
    with pytest.raises(RuntimeError, match="only be called once"):
        await scheduler.run()


async def test_a_shutdown_handle_stops_the_scheduler_from_another_thread() -> None:
    fake = FakeServer(offset_s=5)
    scheduler = sepp.Scheduler(fake, every(10), lookahead=2)
    handle = scheduler.shutdown_handle()
    with trio.fail_after(10):  # the loop would otherwise sleep until the next occurrence
        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)
            assert not handle.is_shutdown
            await trio.to_thread.run_sync(handle.shutdown)
    assert handle.is_shutdown and scheduler.is_shutdown


async def test_a_shutdown_handle_used_before_run_ends_it_at_once(autojump_clock: MockClock) -> None:
    fake = FakeServer()
    scheduler = sepp.Scheduler(fake, every(10))
    scheduler.shutdown_handle().shutdown()
    with trio.fail_after(1):
        await scheduler.run()
    assert fake.info_calls == [] and fake.calls == []


async def test_shutdown_before_run_returns_without_calling_the_server(
    autojump_clock: MockClock,
) -> None:
    fake = FakeServer()
    scheduler = sepp.Scheduler(fake, every(10))
    scheduler.shutdown()
    with trio.fail_after(1):
        await scheduler.run()
    assert fake.info_calls == [] and fake.calls == []


async def test_shutdown_while_waiting_for_the_server_ends_start(
    autojump_clock: MockClock,
) -> None:
    fake = FakeServer()
    fake.info_error = unavailable
    scheduler = sepp.Scheduler(fake, every(10))

    async def stop_later() -> None:
        await trio.sleep(5)
        scheduler.shutdown()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_later)
        with trio.fail_after(60):
            await nursery.start(scheduler.run)
    assert trio.current_time() == 5 and fake.calls == []


async def test_a_key_longer_than_the_server_allows_is_refused_at_start(
    autojump_clock: MockClock,
) -> None:
    fake = FakeServer(max_idempotency_key_bytes=39)  # 14 + len("tick") + 1 + 20 = 39 fits
    await run_for(sepp.Scheduler(fake, every(10, "tick")), 1)
    assert fake.calls
    with pytest.raises(sepp.ValidationError, match="40 bytes") as info, trio.fail_after(10):
        await sepp.Scheduler(fake, every(10, "ticks")).run()
    assert info.value.field == "name"


async def test_a_lookahead_beyond_the_server_horizon_is_refused_at_start(
    autojump_clock: MockClock,
) -> None:
    fake = FakeServer(max_schedule_horizon=timedelta(seconds=30))
    with pytest.raises(sepp.ValidationError, match="horizon") as info, trio.fail_after(10):
        await sepp.Scheduler(fake, every(10), lookahead=31).run()
    assert info.value.field == "lookahead"
    assert fake.calls == []


# -- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"lookahead": 0}, "lookahead"),
        ({"lookahead": -1}, "lookahead"),
        ({"lookahead": timedelta(days=31)}, "lookahead"),
        ({"missed": "some"}, "missed"),
        ({"grace": -1}, "grace"),
        ({"dedup_window": 0}, "dedup_window"),
        # 60 s lookahead + 60 s grace + 5 s margin leave nothing of a two-minute window.
        ({"dedup_window": 125}, "dedup_window"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(sepp.ValidationError) as info:
        sepp.Scheduler(FakeServer(), every(10), **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_an_empty_schedule_is_refused() -> None:
    with pytest.raises(sepp.ValidationError, match="no entries"):
        sepp.Scheduler(FakeServer(), sepp.Schedule())
    with pytest.raises(sepp.ValidationError, match=r"sepp\.Schedule"):
        sepp.Scheduler(FakeServer(), [("tick", 10)])  # type: ignore[arg-type]


def test_just_enough_dedup_window_is_accepted() -> None:
    sepp.Scheduler(FakeServer(), every(10), dedup_window=125.001)


def test_repr_names_the_entries() -> None:
    text = repr(sepp.Scheduler(FakeServer(), every(10, "a").every("b", 5, "q", "t")))
    assert "['a', 'b']" in text and "missed='latest'" in text and "new" in text
