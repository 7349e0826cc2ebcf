"""The server-limits cache behind local validation, on trio's MockClock with a scripted channel:
fetched as soon as the connection is up, never in a call's way, refreshed at most every 30 s."""

from __future__ import annotations

import math
from collections.abc import Awaitable
from datetime import datetime, timezone
from typing import Any

import pytest
import trio
from fixtures.fuzz import examples
from fixtures.scripted_channel import ScriptedChannel, connected
from fixtures.server_info import default_server_info
from hypothesis import example, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

import sepp
from sepp._client.client import Client
from sepp._client.limits import ServerLimits
from sepp._client.retry import NO_RETRY
from sepp._runtime.trio_runtime import TRIO
from sepp._util.log import Log
from sepp.wire._status import StatusCode
from sepp.wire.drivers._trio import RpcError


async def rejected_locally(channel: ScriptedChannel, enqueue: Awaitable[object]) -> bool:
    """Whether `enqueue` raised JobRejectedError without sending an EnqueueBatch."""
    sent = channel.methods().count("EnqueueBatch")
    with pytest.raises(sepp.JobRejectedError):
        await enqueue
    return channel.methods().count("EnqueueBatch") == sent


async def test_limits_are_fetched_as_soon_as_the_connection_is_up(
    autojump_clock: MockClock,
) -> None:
    channel = ScriptedChannel(job_type_limit=8)
    async with connected(channel) as client:
        await trio.testing.wait_all_tasks_blocked()
        assert [(c.at, c.method) for c in channel.calls] == [(0, "GetServerInfo")]
        assert await rejected_locally(channel, client.enqueue("q", "t" * 9))
        assert channel.methods() == ["GetServerInfo"]


async def test_no_fetch_without_local_validation(autojump_clock: MockClock) -> None:
    channel = ScriptedChannel(job_type_limit=8)
    async with connected(channel, validate_locally=False) as client:
        with pytest.raises(sepp.JobRejectedError):
            await client.enqueue("q", "t" * 9)
    assert channel.methods() == ["EnqueueBatch"]


@pytest.mark.parametrize("batching", [None, sepp.Batching(max_delay=0)])
async def test_the_first_enqueue_waits_for_limits_half_its_timeout_at_most(
    batching: sepp.Batching | None, autojump_clock: MockClock
) -> None:
    channel = ScriptedChannel()
    channel.info_delay = math.inf  # a server that never answers GetServerInfo
    async with connected(channel, enqueue_batching=batching) as client:
        ack = await client.enqueue("q", "t", timeout=2)
        assert ack.job_id == "id-0"
        assert trio.current_time() == 1  # not the 30 s rpc_timeout the fetch runs under
        (sent,) = [c for c in channel.calls if c.method == "EnqueueBatch"]
        assert sent.at == 1
        if batching is None:
            assert sent.timeout == 1  # the call keeps what is left of its own deadline


async def test_a_call_waits_for_a_slow_fetch_while_it_has_time(autojump_clock: MockClock) -> None:
    channel = ScriptedChannel(job_type_limit=8)
    channel.info_delay = 0.5
    async with connected(channel) as client:
        assert await rejected_locally(channel, client.enqueue("q", "t" * 9, timeout=2))
        assert trio.current_time() == 0.5


async def test_a_caller_deadline_shorter_than_the_timeout_bounds_the_wait(
    autojump_clock: MockClock,
) -> None:
    channel = ScriptedChannel()
    channel.info_delay = math.inf
    async with connected(channel) as client:
        with trio.move_on_after(4) as scope:
            await client.enqueue("q", "t")  # rpc_timeout 30, but the caller allows 4 s
        assert not scope.cancelled_caught
        assert trio.current_time() == 2


async def test_a_failed_fetch_is_quiet_and_retried_30_s_later(autojump_clock: MockClock) -> None:
    channel = ScriptedChannel(job_type_limit=8)
    channel.info_errors = [RpcError(StatusCode.UNAVAILABLE, "not now")]
    async with connected(channel) as client:
        await trio.sleep(1)
        with pytest.raises(sepp.JobRejectedError):  # the server's own verdict
            await client.enqueue("q", "t" * 9)
        await trio.sleep(28)  # t = 29
        await client.enqueue("q", "ok")
        assert channel.methods() == ["GetServerInfo", "EnqueueBatch", "EnqueueBatch"]
        await trio.sleep(1)  # t = 30: the next enqueue fetches again
        assert await rejected_locally(channel, client.enqueue("q", "t" * 9))
        assert channel.methods()[-1] == "GetServerInfo"


async def test_a_contradicting_rejection_refreshes_the_limits_at_most_every_30_s(
    autojump_clock: MockClock,
) -> None:
    channel = ScriptedChannel(job_type_limit=32)
    async with connected(channel) as client:
        await trio.sleep(1)
        # The server's limit drops to 16 (hot-reloaded); our cache still says 32.
        channel.job_type_limit = channel.advertised_limit = 16
        with pytest.raises(sepp.JobRejectedError):
            await client.enqueue("q", "t" * 20)  # the server rejects, naming 16
        await trio.sleep(10)  # t = 11: within 30 s of the last fetch, no refetch
        with pytest.raises(sepp.JobRejectedError):
            await client.enqueue("q", "t" * 20)
        assert channel.methods().count("GetServerInfo") == 1
        await trio.sleep(19)  # t = 30
        assert await rejected_locally(channel, client.enqueue("q", "t" * 20))
        fetches = [c.at for c in channel.calls if c.method == "GetServerInfo"]
        assert fetches == [0, 30]
        # Dropped again to 12: the next refresh is 30 s after the last fetch, not sooner.
        channel.job_type_limit = channel.advertised_limit = 12
        with pytest.raises(sepp.JobRejectedError):
            await client.enqueue("q", "t" * 14)
        await trio.sleep(29)  # t = 59
        await client.enqueue("q", "ok")
        assert [c.at for c in channel.calls if c.method == "GetServerInfo"] == [0, 30]
        await trio.sleep(1)  # t = 60
        assert await rejected_locally(channel, client.enqueue("q", "t" * 14))
        assert [c.at for c in channel.calls if c.method == "GetServerInfo"] == [0, 30, 60]


async def test_a_rejection_matching_the_cache_does_not_refresh_it(
    autojump_clock: MockClock,
) -> None:
    channel = ScriptedChannel(job_type_limit=8)
    async with connected(channel, validate_locally=True) as client:
        await trio.sleep(1)
        refused = await client.enqueue_batch([sepp.EnqueueRequest("q", "t" * 9)])
        assert refused == [sepp.JobTypeNameTooLong(8, 9)]  # local, with the server's values
        await trio.sleep(100)
        await client.enqueue("q", "ok")
        assert channel.methods() == ["GetServerInfo", "EnqueueBatch"]


async def test_without_a_nursery_the_calling_task_fetches_within_its_budget(
    autojump_clock: MockClock,
) -> None:
    # A Client built directly (tests, benchmarks) has no nursery for the background fetch.
    channel = ScriptedChannel(job_type_limit=8)
    client = Client(
        channel, address="x", rpc_timeout=30.0, retry_policy=NO_RETRY, log=Log(None), runtime=TRIO
    )  # type: ignore[arg-type]
    assert await rejected_locally(channel, client.enqueue("q", "t" * 9))
    channel.info_delay = math.inf
    fresh = Client(
        channel, address="x", rpc_timeout=30.0, retry_policy=NO_RETRY, log=Log(None), runtime=TRIO
    )  # type: ignore[arg-type]
    began = trio.current_time()
    assert (await fresh.enqueue("q", "ok", timeout=4)).job_id
    assert trio.current_time() - began == 2


# -- a batch's jobs checked in one pass --------------------------------------------------------

names_hyp = st.sampled_from(["q", "orders", "a-much-longer-queue-name"])
batch_jobs = st.lists(
    st.builds(
        sepp.EnqueueRequest,
        names_hyp,
        st.sampled_from(["t", "send_email", "a-much-longer-job-type"]),
        payload=st.none()
        | st.builds(
            sepp.Payload.bytes,
            st.sampled_from([1, 2, 8, 9, 20, 21]).map(lambda n: b"p" * n),
            st.sampled_from(["application/json", "text/plain"]),
        ),
        idempotency_key=st.none() | st.sampled_from(["k", "a-long-key"]),
        custom=st.just({})
        | st.dictionaries(st.sampled_from(["a", "bbbbbb"]), st.integers(0, 9), max_size=3),
        scheduled_at=st.none()
        | st.just(datetime(2026, 1, 1, tzinfo=timezone.utc))
        | st.just(datetime(2099, 1, 1, tzinfo=timezone.utc)),
    ),
    min_size=1,
    max_size=12,
)
limit = st.sampled_from([0, 1, 8, 20])
LIMIT_FIELDS = (
    "max_payload_bytes",
    "max_queue_name_bytes",
    "max_job_type_bytes",
    "max_idempotency_key_bytes",
    "max_custom_entries",
    "max_custom_total_bytes",
    "max_custom_key_bytes",
)


_plain = sepp.EnqueueRequest("q", "t", payload=sepp.Payload.bytes(b"p" * 9, "text/plain"))


@settings(max_examples=examples(300))
@given(
    batch_jobs,
    st.builds(
        dict,
        max_payload_bytes=limit,
        max_queue_name_bytes=limit,
        max_job_type_bytes=limit,
        max_idempotency_key_bytes=limit,
        max_custom_entries=st.sampled_from([0, 2]),
        max_custom_total_bytes=limit,
        max_custom_key_bytes=st.sampled_from([0, 3]),
        restricts_encodings=st.booleans(),
    ),
)
# A plain job over the payload limit, and one with an encoding the server does not allow, the
# second time (their names known, so checked inline).
@example([_plain], {"max_payload_bytes": 8})
@example([_plain], {"restricts_encodings": True})
def test_a_batch_checked_in_one_pass_gets_each_job_s_own_verdict(
    jobs: list[sepp.EnqueueRequest], limits: dict[str, Any]
) -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    limits = {f: 0 for f in LIMIT_FIELDS} | {"restricts_encodings": False} | limits
    info = default_server_info(now, allowed_encodings=("application/json",), **limits)
    # The same jobs twice over: the second time their names are known (the inline path).
    one_pass, each = ServerLimits(info, now), ServerLimits(info, now)
    verdicts = [each.check(job) for job in jobs + jobs]
    found = one_pass.check_all(jobs + jobs)
    assert found == (verdicts if any(verdicts) else None)  # None: every job passes
    for job, verdict in zip(jobs, verdicts, strict=False):  # one job: no loop
        assert ServerLimits(info, now).check_all([job]) == (None if verdict is None else [verdict])
